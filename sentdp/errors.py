"""Errors raised by sentdp, split by whose mistake they are.

``InputError`` and ``LimitError`` are the caller's (bad values, documents over a size limit);
``InternalError`` means sentdp itself is wrong and should be reported as a bug.
"""

from __future__ import annotations


class SentDPError(Exception):
    """Base class of every error sentdp raises on purpose."""


class InputError(SentDPError, ValueError):
    """The caller passed a value sentdp cannot use; the message names it and says what to fix."""


class LimitError(InputError):
    """A document is larger than a configured limit (too many sentences, too many documents)."""


class InternalError(SentDPError, RuntimeError):
    """An invariant of sentdp itself failed: a bug in sentdp, not in the caller's input."""

    def __init__(self, message: str) -> None:
        super().__init__(f"internal error (a bug in sentdp, please report it): {message}")
