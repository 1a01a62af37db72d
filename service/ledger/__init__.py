"""Privacy-budget ledgers: :mod:`.types` holds the values and refusals, :mod:`.sql` the
transaction logic, :mod:`.sqlite` the embedded default, :mod:`.postgres` the backend for
several replicas. :func:`open_ledger` picks one from a URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from service.ledger.sql import SqlLedger
from service.ledger.types import (
    IDEMPOTENCY_TTL_SECONDS,
    Account,
    AccountantChangedError,
    BudgetExhaustedError,
    IdempotencyInFlightError,
    IdempotencyKey,
    IdempotencyMismatchError,
    LedgerError,
    Replay,
    Reservation,
    StoredReplies,
)

__all__ = [
    "IDEMPOTENCY_TTL_SECONDS",
    "Account",
    "AccountantChangedError",
    "BudgetExhaustedError",
    "IdempotencyInFlightError",
    "IdempotencyKey",
    "IdempotencyMismatchError",
    "LedgerError",
    "LedgerMissingError",
    "Replay",
    "Reservation",
    "SqlLedger",
    "StoredReplies",
    "open_ledger",
]


class LedgerMissingError(ValueError):
    """``open_ledger(..., create=False)`` found no ledger where the URL points."""


def open_ledger(
    url: str, schema: str = "public", pending_timeout: float = 300.0, create: bool = True
) -> SqlLedger:
    """A ledger from a URL, initialised (created if absent, unless ``create`` is False:
    then :class:`LedgerMissingError`, and nothing is created).

    ``sqlite:///relative/file.db`` or ``sqlite:////absolute/file.db`` (SQLAlchemy's
    convention), or ``postgresql://user@host:port/database``.
    """
    parsed = urlparse(url)
    ledger: SqlLedger
    if parsed.scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise ValueError(  # not quoted: a mistyped URL can hold a password
                "a SQLite ledger URL is sqlite:/// and a file path (sqlite:///relative or "
                "sqlite:////absolute)"
            )
        path = url[len("sqlite:///") :]
        if not create and not Path(path).is_file():
            raise LedgerMissingError(f"no ledger at {path}")
        from service.ledger.sqlite import SqliteLedger

        ledger = SqliteLedger(Path(path), pending_timeout=pending_timeout)
    elif parsed.scheme in {"postgresql", "postgres"}:
        from service.ledger.postgres import PostgresLedger, holds_a_ledger

        if not create and not holds_a_ledger(url, schema):
            database = parsed.path.lstrip("/") or "(default)"
            raise LedgerMissingError(f"no ledger in schema {schema} of database {database}")
        ledger = PostgresLedger(url, schema=schema, pending_timeout=pending_timeout)
    else:
        # Only the scheme: the rest of a URL may hold a password.
        raise ValueError(
            f"unsupported ledger URL scheme {parsed.scheme!r}: use sqlite:///path or "
            "postgresql://user@host:port/database"
        )
    ledger.initialise()
    return ledger
