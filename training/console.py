"""The command-line tools' terminal: text printed as given, never read as markup."""

from __future__ import annotations

from rich.console import Console


def plain_console() -> Console:
    """A stderr console that prints text as it is: no rich markup, emoji codes or
    highlighting, so a file name, a CSV column or a server's message holding ``[/x]`` or
    ``:x:`` is shown as written instead of breaking (or changing) the message."""
    return Console(stderr=True, markup=False, emoji=False, highlight=False)
