"""The embedded default ledger: one SQLite file in WAL mode, shared by every worker process.

Write transactions start with ``BEGIN IMMEDIATE`` (the writer lock is taken up front, so two
processes never deadlock upgrading read locks) and wait up to ``busy_timeout`` for it. Before
that, each waits its turn on an exclusive ``flock`` of a side file (``<ledger>.writers``):
SQLite's busy handler only polls, at growing intervals, so a process that commits back to
back kept the lock from another process for seconds (measured: 1 commit against 11,949 in
4 s); the kernel's lock queue serves both (``loadtests/sqlite_writers.py``).
``synchronous=FULL`` makes every commit durable before the response is sent, and
``secure_delete`` overwrites deleted rows. A new database file is created with mode 0600
(SQLite gives its -wal and -shm files the same mode), in a folder created 0700.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.ledger.sql import SqlLedger

MIN_SQLITE = (3, 35, 0)  # UPDATE ... RETURNING


def _flock_within(lock: int, timeout: float) -> bool:
    """Take an exclusive ``flock`` of ``lock`` in the kernel's queue of waiters (a blocking
    wait, which serves waiters fairly; polling would lose to a process that locks again at
    once), giving up after ``timeout`` seconds. A blocking ``flock`` cannot be timed out,
    so it waits on a thread of its own. On False the descriptor is no longer the caller's:
    it is closed here, or by that thread once its wait ends (releasing the lock)."""
    import fcntl

    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    ended = threading.Event()
    guard = threading.Lock()
    outcome: list[bool] = []
    abandoned = False

    def wait() -> None:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            taken = True
        except OSError:
            taken = False
        with guard:
            if abandoned:
                os.close(lock)
                return
            outcome.append(taken)
            ended.set()

    threading.Thread(target=wait, name="sentdp-ledger-turn", daemon=True).start()
    ended.wait(timeout)
    with guard:
        if not ended.is_set():
            abandoned = True
            return False
    if not outcome[0]:
        os.close(lock)
    return outcome[0]


class SqliteLedger(SqlLedger):
    parallel_writes = False  # one writer at a time, and its busy handler serves waiters in no order

    def __init__(
        self,
        path: Path,
        busy_timeout: float = 30.0,
        pending_timeout: float = 300.0,
        queue_writers: bool = True,
    ):
        super().__init__(pending_timeout)
        self.queue_writers = queue_writers and sys.platform != "win32"
        """Writers wait their turn on ``<ledger>.writers`` (False: only SQLite's busy
        handler; the reference of ``loadtests/sqlite_writers.py``)."""
        self._warned_writers_file = False
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise RuntimeError(
                f"SQLite {sqlite3.sqlite_version} is too old for the ledger (need 3.35+)"
            )
        self.path = Path(path)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.path.exists():
            with contextlib.suppress(FileExistsError):  # another process created it first
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        self.busy_timeout = busy_timeout

    def _connect(self) -> Any:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=True
        )
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        self._use_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        # Deleted rows (expired idempotency HMACs, a moved secret) are overwritten with zeros,
        # whatever this SQLite build's default.
        conn.execute("PRAGMA secure_delete=ON")
        return conn

    def _use_wal(self, conn: Any) -> None:
        """Switch a new file to WAL. The switch needs the file to itself and SQLite does not
        wait for it, so processes opening a fresh ledger together retry until busy_timeout."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def scrub(self, wait: float | None = None) -> bool:
        """Copy the WAL into the database file and truncate it: with ``secure_delete`` the
        deleted rows' bytes are overwritten in the database file and gone from the WAL. The
        checkpoint waits up to ``wait`` seconds (``busy_timeout`` by default) for other
        connections' reads to end, and new writers of every process wait while it does; if
        one still reads, it gives up (False) and the WAL is left to SQLite's own checkpoints
        until the next scrub."""
        conn = self._connection()
        if wait is not None:
            conn.execute(f"PRAGMA busy_timeout={int(wait * 1000)}")
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        finally:
            if wait is not None:
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        return not busy

    def _columns(self, cur: Any, table: str) -> set[str]:
        return {str(row[1]) for row in cur.execute(f"PRAGMA table_info({table})").fetchall()}

    @contextmanager
    def _writers_turn(self) -> Iterator[None]:
        """This transaction's turn among the ledger's writers, in every process: an
        exclusive ``flock`` of ``<ledger>.writers``, released when the file is closed (also
        when a process dies). Waits up to ``busy_timeout``, then "database is locked" as
        SQLite would say (a stopped process holding the turn must not hang the others); a
        lock file that cannot be opened leaves the writers to SQLite's busy handler."""
        if not self.queue_writers:
            yield
            return
        if getattr(self._local, "in_turn", False):
            raise RuntimeError("a ledger transaction is already open on this thread")
        lock = self._open_writers_file()
        if lock is None:
            yield
            return
        try:
            if not _flock_within(lock, self.busy_timeout):
                lock = None  # closed by _flock_within or by its waiting thread
                raise sqlite3.OperationalError("database is locked (waiting for the writers' turn)")
            self._local.in_turn = True
            try:
                yield
            finally:
                self._local.in_turn = False
        finally:
            if lock is not None:
                os.close(lock)

    def _open_writers_file(self) -> int | None:
        """``<ledger>.writers``, created 0600 and owned like the ledger file; None (logged
        once) where it cannot be opened."""
        path = f"{self.path}.writers"
        flags = os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        flags |= getattr(os, "O_CLOEXEC", 0)
        try:
            lock = os.open(path, flags, 0o600)
        except OSError as error:
            if not self._warned_writers_file:
                self._warned_writers_file = True
                logging.getLogger("sentdp.service").warning(
                    "the ledger's writers cannot take turns (%s); SQLite's busy handler "
                    "alone orders them",
                    error.strerror,
                )
            return None
        if os.geteuid() == 0:  # as root (sentdp-admin): leave it to the ledger's owner
            with contextlib.suppress(OSError):
                ledger = self.path.stat()
                if os.fstat(lock).st_uid != ledger.st_uid:
                    os.fchown(lock, ledger.st_uid, ledger.st_gid)
        return lock

    @contextmanager
    def _write_transaction(self, conn: Any) -> Iterator[Any]:
        with self._writers_turn(), self._sqlite_transaction(conn) as cursor:
            yield cursor

    @contextmanager
    def _sqlite_transaction(self, conn: Any) -> Iterator[Any]:
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
