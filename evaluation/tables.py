"""What the comparison scripts of this package share: bundle tags on the command
line, and their results printed as Markdown tables (the form the README quotes)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence

from sentdp.bundle import Bundle
from training.store import load_from_store


def tag_parser(prog: str) -> argparse.ArgumentParser:
    """A parser whose positional arguments are bundle tags in the model store."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("tags", nargs="+", metavar="TAG", help="bundles in the model store")
    return parser


def bundles(tags: Sequence[str]) -> Iterable[Bundle]:
    """Each tag's bundle, loaded when its turn comes (a bundle holds its candidates)."""
    for tag in tags:
        yield load_from_store(tag)


def print_table(title: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """``title`` after a blank line, then a Markdown table of ``header`` and ``rows``."""
    print(f"\n{title}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
