"""The ledger for several replicas: a PostgreSQL server, one schema per deployment.

Transactions run at READ COMMITTED: the conditional ``UPDATE ... WHERE g * (spent + c) <= B``
re-checks its condition on the newest row version after waiting for a concurrent writer, so
the check-and-debit stays atomic; idempotency rows are locked with ``SELECT ... FOR UPDATE``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from service.ledger.sql import SqlLedger, to_named_pyformat

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def holds_a_ledger(url: str, schema: str) -> bool:
    """Whether ``schema`` holds a sentdp ledger (its ``sentdp_meta`` table), looked up
    without creating anything."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.tables "
            "WHERE table_schema = %s AND table_name = 'sentdp_meta'",
            (schema,),
        ).fetchone()
    return found is not None


class PostgresLedger(SqlLedger):
    autoincrement = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"

    def __init__(self, url: str, schema: str = "public", pending_timeout: float = 300.0):
        super().__init__(pending_timeout)
        if not _SCHEMA_NAME.match(schema):
            raise ValueError(f"invalid PostgreSQL schema name {schema!r}")
        self.url = url
        self.schema = schema

    def _connect(self) -> Any:
        import psycopg

        conn = psycopg.connect(self.url, autocommit=True)
        exists = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
        if conn.execute(exists, (self.schema,)).fetchone() is None:
            # Replicas starting together: concurrent CREATE ... IF NOT EXISTS can still fail
            # on PostgreSQL's catalog indexes, so schema changes take turns.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._schema_lock_key(),))
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
        conn.execute(f"SET search_path TO {self.schema}")
        conn.autocommit = False
        return conn

    @contextmanager
    def _write_transaction(self, conn: Any) -> Iterator[Any]:
        with conn.transaction(), conn.cursor() as cursor:
            yield cursor

    def _schema_lock_key(self) -> int:
        digest = hashlib.sha256(f"sentdp schema {self.schema}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def _serialise_schema_changes(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._schema_lock_key(),))

    def _lock_table(self, cur: Any, table: str) -> None:
        cur.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")

    def _lock_clause(self) -> str:
        return " FOR UPDATE"

    def _skip_locked_clause(self) -> str:
        return " FOR UPDATE SKIP LOCKED"

    def _bound_lock_waits(self, cur: Any, seconds: float) -> None:
        cur.execute(f"SET LOCAL lock_timeout = {max(1, int(seconds * 1000))}")  # milliseconds

    def _database_now(self, cur: Any) -> float | None:
        cur.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
        return float(cur.fetchone()[0])

    def _lost(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    def _columns(self, cur: Any, table: str) -> set[str]:
        cur.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %(t)s",
            {"t": table},
        )
        return {str(row[0]) for row in cur.fetchall()}

    def _sql(self, text: str) -> str:
        return to_named_pyformat(text)

    def drop_schema(self) -> None:
        """Remove the whole schema (tests use one schema each)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
