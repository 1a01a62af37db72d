"""The embedded default ledger: one SQLite file in WAL mode, shared by every worker process.

Write transactions start with ``BEGIN IMMEDIATE`` (the writer lock is taken up front, so two
processes never deadlock upgrading read locks) and wait up to ``busy_timeout`` for it.
``synchronous=FULL`` makes every commit durable before the response is sent.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.ledger.sql import SqlLedger

MIN_SQLITE = (3, 35, 0)  # UPDATE ... RETURNING


class SqliteLedger(SqlLedger):
    def __init__(self, path: Path, busy_timeout: float = 30.0, pending_timeout: float = 300.0):
        super().__init__(pending_timeout)
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise RuntimeError(
                f"SQLite {sqlite3.sqlite_version} is too old for the ledger (need 3.35+)"
            )
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.busy_timeout = busy_timeout

    def _connect(self) -> Any:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=True
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        return conn

    @contextmanager
    def _write_transaction(self, conn: Any) -> Iterator[Any]:
        cursor = conn.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        try:
            yield cursor
        except BaseException:
            conn.rollback()
            raise
        else:
            conn.commit()
        finally:
            cursor.close()
