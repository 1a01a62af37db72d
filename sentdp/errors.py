"""Errors raised by sentdp, split by whose mistake they are.

``InputError`` and ``LimitError`` are the caller's (bad values, documents over a size limit);
``InternalError`` means sentdp itself is wrong and should be reported as a bug.
"""

from __future__ import annotations

from typing import Any


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


class SettingsError(InputError):
    """A ``SENTDP_*`` environment variable cannot be used. The message names the variables
    and what is wrong with them, never their values: a ledger URL holds a password, and the
    metrics token is a secret, and both would otherwise reach the server's log."""

    @classmethod
    def from_validation(cls, error: Any, prefix: str = "SENTDP_") -> SettingsError:
        """The error for pydantic's ``ValidationError`` of a settings object (duck-typed, so
        the core does not import pydantic-settings)."""
        problems = []
        found = error.errors(include_url=False, include_input=False, include_context=False)
        # A default computed from other settings is not computed once one of them failed;
        # pydantic reports that as an error of its own, which only hides the real one.
        real = [p for p in found if p.get("type") != "default_factory_not_called"]
        for problem in real or found:
            location = problem.get("loc") or ()
            name = f"{prefix}{str(location[0]).upper()}" if location else "the settings together"
            message = str(problem.get("msg", "is not valid")).removeprefix("Value error, ")
            problems.append(f"{name}: {message}")
        return cls("a SENTDP_* setting is not valid: " + "; ".join(problems))
