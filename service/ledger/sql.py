"""The privacy-budget ledger: one interface, one transaction logic, two SQL backends.

Every debit is one atomic check-and-debit statement inside one transaction that also records
the per-document charge rows and the idempotency row, so no crash leaves half of a request in
the database. Charges move ``reserved -> final`` (the mechanism ran or may have run) or
``reserved -> refunded`` (it certainly drew no randomness). A crash between the two leaves
them ``reserved``: still counted, so the ledger may over-charge but never under-charges.
Invariant: ``accounts.spent_micro`` = sum of this period's charges that are not refunded,
until the operator prunes settled charge rows (:meth:`SqlLedger.prune_history`): audit a
ledger against its charges before pruning them.

A connection the server dropped is replaced: a transaction whose BEGIN fails on a lost
connection is retried once on a new one (nothing was sent yet, so nothing is charged twice);
any later failure discards the connection and raises. Idempotency rows are purged once their
window has passed (:data:`~service.ledger.types.IDEMPOTENCY_TTL_SECONDS`). The tables are in
:mod:`service.ledger.schema`.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sentdp.accounting import Charge, Policy
from service.ledger import spend
from service.ledger.schema import (
    ADDED_COLUMNS,
    INDEXES,
    RECORD_VERSION,
    RECOUNT_STORED_REPLIES,
    SCHEMA_VERSION,
    STORED_REPLIES_COUNTED_SINCE,
    UPGRADES,
    create_tables,
)
from service.ledger.types import (
    IDEMPOTENCY_TTL_SECONDS,
    Account,
    BudgetExhaustedError,
    IdempotencyInFlightError,
    IdempotencyKey,
    IdempotencyMismatchError,
    Replay,
    Reservation,
    StoredReplies,
)

PURGE_INTERVAL_SECONDS = 60.0
"""How often one process purges expired idempotency rows (:meth:`SqlLedger.purge_due`: on its
next reservation, or from the gateway's housekeeping timer, whichever comes first)."""
SCRUB_WAIT_SECONDS = 0.1
"""How long the housekeeping timer's checkpoint waits for other connections' reads (new
writers of every process wait with it): a long read, such as a backup, makes it give up
and try again a minute later instead of holding every reservation back."""
PURGE_CHUNK_ROWS = 500
"""Expired idempotency rows one reservation deletes at most: a minute's worth at a high
request rate (6,000 rows of 5 KB replies took 100 ms in one SQLite transaction, while every
other ledger call of the process waited) is spread over the next reservations instead."""
PRUNE_CHUNK_ROWS = 5_000
"""Rows of the operator's history prune (:meth:`SqlLedger.prune_history`) per transaction."""

_NAMED = re.compile(r":([a-z_]+)")
_OWNED_KEY = (
    "WHERE tenant = :t AND user_id = :u AND key = :k AND "
    "(CAST(:rid AS TEXT) IS NULL OR request_id IS NULL OR request_id = :rid)"
)
"""An idempotency row, if the request ``:rid`` still owns it (any owner when ``:rid`` is null)."""
_COUNT_STORED = (
    "INSERT INTO sentdp_stored_replies (tenant, bytes) "
    "VALUES (:t, CASE WHEN :b > 0 THEN :b ELSE 0 END) "
    "ON CONFLICT (tenant) DO UPDATE SET bytes = CASE "
    "WHEN sentdp_stored_replies.bytes + :b > 0 THEN sentdp_stored_replies.bytes + :b ELSE 0 END"
)
"""Add ``:b`` (negative: a deletion) to the bytes of ``:t``'s stored replies (never below 0:
replies an older sentdp stored were never counted). Every transaction takes this tenant-wide
row last, after the key and the user's account, so none waits for another in a cycle."""


class SqlLedger(abc.ABC):
    """Transaction logic shared by the SQLite and PostgreSQL backends."""

    placeholder_style = "named"  # ":name" (SQLite); PostgreSQL converts to "%(name)s"
    autoincrement = "INTEGER PRIMARY KEY AUTOINCREMENT"
    parallel_writes = True
    """Whether write transactions of several threads can run at once (False: a process
    gains nothing from more than one thread calling the ledger)."""

    def __init__(self, pending_timeout: float = 300.0) -> None:
        self.pending_timeout = pending_timeout
        self._local = threading.local()
        self._connections: list[Any] = []
        self._lock = threading.Lock()
        self._last_purge = -math.inf
        self._purged_unscrubbed = False
        self._last_scrub = -math.inf
        self._scrub_failures = 0

    # --- backend hooks -------------------------------------------------------------------
    @abc.abstractmethod
    def _connect(self) -> Any:
        """A new DB-API connection in manual-transaction mode."""

    @abc.abstractmethod
    @contextmanager
    def _write_transaction(self, conn: Any) -> Iterator[Any]:
        """A transaction that may write: yields a cursor; commits or rolls back."""

    def _lock_clause(self) -> str:
        return ""

    def _skip_locked_clause(self) -> str:
        """Locks the rows a subquery selects, skipping those another transaction holds
        (PostgreSQL); SQLite has one writer at a time."""
        return ""

    def _bound_lock_waits(self, cur: Any, seconds: float) -> None:
        """Make this transaction's row-lock waits give up after ``seconds`` (PostgreSQL);
        SQLite's writers wait out their busy timeout in any case."""
        return None

    def _database_now(self, cur: Any) -> float | None:
        """The database server's clock (Unix seconds), or None to use this process's."""
        return None

    def _now(self, cur: Any) -> float:
        """The time every decision of a transaction is made at: the database's clock where
        replicas share one (so no replica's skewed clock abandons another's key early, or
        opens a period early), else this process's."""
        database = self._database_now(cur)
        return time.time() if database is None else database

    def _lost(self, conn: Any) -> bool:
        """Whether the server dropped this connection (it must be replaced)."""
        return False

    def _columns(self, cur: Any, table: str) -> set[str]:
        """The column names of ``table``."""
        raise NotImplementedError

    def _sql(self, text: str) -> str:
        return text

    def scrub(self, wait: float | None = None) -> bool:
        """Remove deleted rows' bytes from the backend's files where it can (after a secret
        or expired replies are deleted), waiting up to ``wait`` seconds for other
        connections; False if it could not. PostgreSQL keeps them in its WAL and backups
        until they expire: nothing to do here."""
        return True

    # --- plumbing ------------------------------------------------------------------------
    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _discard(self, conn: Any) -> None:
        self._local.conn = None
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)
        with contextlib.suppress(Exception):  # it is gone already
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A write transaction on this thread's connection (replaced if the server lost it)."""
        conn = self._connection()
        stack = contextlib.ExitStack()
        try:
            cursor = stack.enter_context(self._write_transaction(conn))
        except Exception:
            if not self._lost(conn):
                raise
            self._discard(conn)  # BEGIN failed: nothing was sent, so one retry is safe
            conn = self._connection()
            cursor = stack.enter_context(self._write_transaction(conn))
        try:
            with stack:
                yield cursor
        except BaseException:
            if self._lost(conn):
                self._discard(conn)
            raise

    def _execute(self, cursor: Any, sql: str, params: dict[str, Any] | None = None) -> Any:
        cursor.execute(self._sql(sql), params or {})
        return cursor

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(Exception):  # closing is best effort
                    conn.close()
            self._connections.clear()
        self._local = threading.local()

    def initialise(self) -> None:
        """Create or upgrade the tables and record the schema version (idempotent)."""
        with self.transaction() as cur:
            self._serialise_schema_changes(cur)
            for statement in create_tables(self.autoincrement):
                self._execute(cur, statement)
            for table, column, kind in ADDED_COLUMNS:
                if column not in self._columns(cur, table):
                    self._execute(cur, f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            for statement in UPGRADES:
                self._execute(cur, statement)
            for statement in INDEXES:
                self._execute(cur, statement)
            recorded = self._execute(
                cur, "SELECT value FROM sentdp_meta WHERE key = 'schema_version'"
            ).fetchone()
            if recorded is None or int(recorded[0]) < STORED_REPLIES_COUNTED_SINCE:
                self._recount_stored_replies(cur)  # replies stored before were never counted
            self._execute(cur, RECORD_VERSION, {"v": str(SCHEMA_VERSION)})

    def recount_stored_replies(self) -> None:
        """Count every tenant's stored reply bytes again from the rows: a replica from before
        schema 5 that purged or took over counted rows never lowered the count (run once no
        such replica is left; every writer of the count waits meanwhile)."""
        with self.transaction() as cur:
            self._recount_stored_replies(cur)

    def _recount_stored_replies(self, cur: Any) -> None:
        self._lock_table(cur, "sentdp_stored_replies")  # running replicas' settles wait
        for statement in RECOUNT_STORED_REPLIES:
            self._execute(cur, statement)

    def _serialise_schema_changes(self, cur: Any) -> None:
        """Make replicas that initialise together take turns (SQLite's write lock does)."""
        return None

    def _lock_table(self, cur: Any, table: str) -> None:
        """Keep every other writer of ``table`` out until commit (SQLite's write lock does)."""
        return None

    def legacy_hmac_secret(self) -> bytes | None:
        """The body-HMAC secret that schema version 1 kept in the database, if still there."""
        with self.transaction() as cur:
            row = self._execute(
                cur, "SELECT value FROM sentdp_meta WHERE key = 'hmac_secret'"
            ).fetchone()
        return bytes.fromhex(row[0]) if row is not None else None

    def forget_legacy_hmac_secret(self) -> None:
        """Remove the version-1 secret from the database once it lives in the secret file."""
        with self.transaction() as cur:
            self._execute(cur, "DELETE FROM sentdp_meta WHERE key = 'hmac_secret'")
        if not self.scrub():
            logging.getLogger("sentdp.service").warning(
                "the ledger's write-ahead log could not be truncated (another connection kept "
                "reading); the deleted secret may stay in its WAL until SQLite reuses it"
            )

    def purge_expired(self, now: float | None = None, limit: int | None = None) -> int:
        """Delete idempotency rows older than their window, the oldest ``limit`` of them
        (all by default); returns how many went."""
        with self.transaction() as cur:
            cutoff = (self._now(cur) if now is None else now) - IDEMPOTENCY_TTL_SECONDS
            if limit is None:
                sql = "DELETE FROM sentdp_idempotency WHERE created_at < :c"
            else:
                sql = (
                    "DELETE FROM sentdp_idempotency WHERE (tenant, user_id, key) IN ("
                    "SELECT tenant, user_id, key FROM sentdp_idempotency WHERE created_at < :c "
                    "ORDER BY created_at LIMIT :n)"
                )
            deleted = self._execute(
                cur, sql + " RETURNING tenant, response_bytes", {"c": cutoff, "n": limit}
            ).fetchall()
            freed: Counter[str] = Counter()
            for tenant, size in deleted:
                freed[str(tenant)] += int(size or 0)
            for tenant, size in sorted(freed.items()):
                if size:
                    self._execute(cur, _COUNT_STORED, {"t": tenant, "b": -size})
        return len(deleted)

    def stored_reply_bytes(self, tenant: str) -> int:
        """Bytes of ``tenant``'s stored replies (those this sentdp version counted)."""
        with self.transaction() as cur:
            return self._stored_bytes(cur, tenant)

    def purge_due(self, now: float | None = None) -> int:
        """Once a minute (``now``: :func:`time.monotonic`), one chunk of expired idempotency
        rows; how many went (0 when none was due). Each reservation calls it, and so does the
        gateway's housekeeping timer, so stored replies leave the ledger after their window
        even when no charged request comes. While chunks come back full, the next call takes
        the next one. Never raises: it is housekeeping, and a request may ride on it."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._last_purge < PURGE_INTERVAL_SECONDS:
                return 0
            self._last_purge = now
        try:
            deleted = self.purge_expired(limit=PURGE_CHUNK_ROWS)
        except Exception:  # housekeeping: the request it rides on must not fail for it
            logging.getLogger("sentdp.service").warning(
                "purging expired idempotency rows failed; the next purge retries",
                exc_info=True,
            )
            return 0
        with self._lock:
            if deleted >= PURGE_CHUNK_ROWS:  # more are left
                self._last_purge = -math.inf
            if deleted:
                self._purged_unscrubbed = True
        return deleted

    def housekeep(self) -> int:
        """The gateway timer's call: :meth:`purge_due`, then, if rows of stored replies were
        deleted since the last scrub (by a purge, or by a reservation taking over an expired
        key) and no full chunk is waiting, :meth:`scrub` (on SQLite a checkpoint that
        truncates the WAL, so a deleted reply's bytes, overwritten by ``secure_delete``, are
        gone from the files a backup copies). At most one scrub a minute; it waits at most
        :data:`SCRUB_WAIT_SECONDS` for other connections' reads (new writers wait meanwhile)
        and otherwise tries again a minute later, with a warning from the third failure in
        a row. Reservations only purge. Never raises; how many rows went."""
        deleted = self.purge_due()
        now = time.monotonic()
        with self._lock:
            if (
                not self._purged_unscrubbed
                or deleted >= PURGE_CHUNK_ROWS  # the next chunk comes at once: scrub after it
                or now - self._last_scrub < PURGE_INTERVAL_SECONDS
            ):
                return deleted
            self._purged_unscrubbed, self._last_scrub = False, now
        try:
            scrubbed = self.scrub(SCRUB_WAIT_SECONDS)
        except Exception:  # housekeeping: a minute later it tries again
            logging.getLogger("sentdp.service").warning(
                "removing purged rows' bytes from the ledger's files failed", exc_info=True
            )
            scrubbed = False
        with self._lock:
            if scrubbed:
                self._scrub_failures = 0
                return deleted
            self._purged_unscrubbed = True
            self._scrub_failures += 1
            failures = self._scrub_failures
        if failures >= 3:
            logging.getLogger("sentdp.service").warning(
                "the ledger's write-ahead log could not be truncated %d times in a row (another "
                "connection keeps reading): purged replies may stay in its files until it can",
                failures,
            )
        return deleted

    # --- the ledger's operations ---------------------------------------------------------
    def account(self, tenant: str, user: str, policy: Policy | None = None) -> Account:
        """The user's account as stored or, given the tenant's ``policy``, as the next
        request will find it (a period that has ended shows as the next, empty one)."""
        with self.transaction() as cur:
            if policy is None:
                return self._account(cur, tenant, user)
            return spend.view_account(self, cur, tenant, user, policy, self._now(cur))

    def _account(self, cur: Any, tenant: str, user: str) -> Account:
        return spend.read_account(self, cur, tenant, user)

    def reserve(
        self,
        tenant: str,
        user: str,
        charge: Charge,
        policy: Policy,
        request_id: str,
        idempotency: IdempotencyKey | None = None,
    ) -> Reservation | Replay:
        """Atomically check the idempotency key, check-and-debit, and record the charges.

        Raises :class:`BudgetExhaustedError`, :class:`AccountantChangedError`,
        :class:`IdempotencyInFlightError` or :class:`IdempotencyMismatchError`; on any of them
        nothing is written.
        """
        self.purge_due(time.monotonic())
        params = {"t": tenant, "u": user}
        freed = 0
        with self.transaction() as cur:
            now = self._now(cur)
            if idempotency is not None:
                replay, freed = self._claim_key(cur, tenant, user, idempotency, now, request_id)
                if replay is not None:
                    return replay
            before = spend.prepare(self, cur, tenant, user, policy, now)
            account = spend.debit(self, cur, before, charge, policy)
            if account is None:
                raise BudgetExhaustedError(before, charge, policy)
            ids = []
            documents = charge.document_ids or (None,) * charge.documents
            for document_id in documents:
                inserted = self._execute(
                    cur,
                    "INSERT INTO sentdp_charges (tenant, user_id, period, micro, units, state, "
                    "request_id, created_at, document_id) VALUES "
                    "(:t, :u, :p, :m, :units, 'reserved', :r, :now, :d) RETURNING id",
                    params
                    | {
                        "p": account.period,
                        "m": charge.micro,
                        "units": policy.units(charge.micro),
                        "r": request_id,
                        "now": now,
                        "d": document_id,
                    },
                ).fetchone()
                ids.append(int(inserted[0]))
            if freed:  # last, as in a settlement: the tenant's counter is locked after the user
                self._execute(cur, _COUNT_STORED, {"t": tenant, "b": -freed})
        if freed:  # an expired key's reply went: its bytes are for the next scrub
            with self._lock:
                self._purged_unscrubbed = True
        return Reservation(ids, account)

    def _claim_key(
        self, cur: Any, tenant: str, user: str, key: IdempotencyKey, now: float, request_id: str
    ) -> tuple[Replay | None, int]:
        """Claim the key for ``request_id``, or find its stored response. Only an expired key
        may change body; an abandoned one (pending too long) is taken over by the same body.
        Also returns the bytes of a stored reply the claim deleted (its tenant's count is
        lowered at the end of the reservation)."""
        params = {"t": tenant, "u": user, "k": key.key}
        freed = 0
        select = (
            "SELECT body_hmac, state, response, created_at, status FROM sentdp_idempotency "
            "WHERE tenant = :t AND user_id = :u AND key = :k"
        )
        row = self._execute(cur, select + self._lock_clause(), params).fetchone()
        if row is not None:
            body_hmac, state, response, created, status = row
            expired = now - float(created) > IDEMPOTENCY_TTL_SECONDS
            abandoned = state == "pending" and now - float(created) > self.pending_timeout
            if not expired and not key.matches(str(body_hmac)):
                raise IdempotencyMismatchError
            if not (expired or abandoned):
                if state == "done":
                    replay = Replay(str(response), int(status) if status is not None else 200)
                    return replay, 0
                raise IdempotencyInFlightError
            deleted = self._execute(
                cur,
                "DELETE FROM sentdp_idempotency WHERE tenant = :t AND user_id = :u AND key = :k "
                "RETURNING response_bytes",
                params,
            ).fetchone()
            freed = int(deleted[0] or 0) if deleted is not None else 0
        inserted = self._execute(
            cur,
            "INSERT INTO sentdp_idempotency "
            "(tenant, user_id, key, body_hmac, state, created_at, request_id) "
            "VALUES (:t, :u, :k, :h, 'pending', :now, :rid) "
            "ON CONFLICT (tenant, user_id, key) DO NOTHING RETURNING key",
            params | {"h": key.body_hmac, "now": now, "rid": request_id},
        ).fetchone()
        if inserted is None:  # a concurrent request inserted it first
            raise IdempotencyInFlightError
        return None, freed

    def settle(
        self,
        tenant: str,
        user: str,
        final: Sequence[int],
        refund: Sequence[int],
        idempotency: IdempotencyKey | None = None,
        response: str | None = None,
        status: int = 200,
        request_id: str | None = None,
        kept: StoredReplies | None = None,
        lock_timeout: float | None = None,
    ) -> Account:
        """Finalise and refund charges, and store or release the idempotency key, atomically.

        Only charges still ``reserved`` move; a refund returns exactly what was debited.
        With ``response`` (and its HTTP ``status``) the key is marked done and later retries
        replay it; without, the key is released for a retry. With ``request_id``, only a key
        this request still owns is touched (another request may have taken it over). With
        ``kept``, a reply that would take the tenant's stored replies past ``kept.limit``
        bytes is stored as ``kept.instead`` (the key stays done: a retry never pays twice).
        With ``lock_timeout``, waiting for a row lock longer than that raises (PostgreSQL:
        a second attempt must not wait for a first one's session that outlived its
        connection).
        """
        with self.transaction() as cur:
            if lock_timeout is not None:
                self._bound_lock_waits(cur, lock_timeout)
            now = self._now(cur)
            # Rows are locked in the order a reservation locks them (the key, the account,
            # then document rows), or a refund and a reservation of the same user could each
            # hold what the other waits for (PostgreSQL; SQLite runs one writer at a time).
            lock = self._lock_clause()
            if lock:
                if idempotency is not None:
                    self._execute(
                        cur,
                        "SELECT 1 FROM sentdp_idempotency WHERE tenant = :t AND user_id = :u "  # noqa: S608 (constants)
                        "AND key = :k" + lock,
                        {"t": tenant, "u": user, "k": idempotency.key},
                    )
                self._execute(
                    cur,
                    "SELECT 1 FROM sentdp_accounts WHERE tenant = :t AND user_id = :u" + lock,  # noqa: S608 (constants)
                    {"t": tenant, "u": user},
                )
            # Each charge is matched with its owner too, so a wrong id can never move, or
            # credit, another user's charge.
            owner = {"t": tenant, "u": user, "now": now}
            for charge_id in final:
                self._execute(
                    cur,
                    "UPDATE sentdp_charges SET state = 'final', settled_at = :now "
                    "WHERE id = :id AND tenant = :t AND user_id = :u AND state = 'reserved'",
                    owner | {"id": charge_id},
                )
            for charge_id in refund:
                row = self._execute(
                    cur,
                    "UPDATE sentdp_charges SET state = 'refunded', settled_at = :now "
                    "WHERE id = :id AND tenant = :t AND user_id = :u AND state = 'reserved' "
                    "RETURNING micro, units, period, document_id",
                    owner | {"id": charge_id},
                ).fetchone()
                if row is not None:
                    spend.credit(self, cur, tenant, user, tuple(row))
            if idempotency is not None:
                if response is not None and kept is not None:
                    response, status = kept.reply(self._stored_bytes(cur, tenant), response, status)
                self._store_key(cur, tenant, user, idempotency.key, response, status, request_id)
            return self._account(cur, tenant, user)

    def _store_key(
        self,
        cur: Any,
        tenant: str,
        user: str,
        key: str,
        response: str | None,
        status: int,
        request_id: str | None,
    ) -> None:
        params = {"t": tenant, "u": user, "k": key, "rid": request_id}
        if response is not None:
            size = len(response.encode())
            # Only a pending key takes a reply: a settlement tried again after its first
            # attempt committed (its answer lost) must not count the reply's bytes twice.
            stored = self._execute(
                cur,
                "UPDATE sentdp_idempotency SET state = 'done', response = :r, status = :s, "  # noqa: S608 (constants)
                "response_bytes = :b " + _OWNED_KEY + " AND state = 'pending'",
                params | {"r": response, "s": status, "b": size},
            ).rowcount
            if stored > 0:
                self._execute(cur, _COUNT_STORED, {"t": tenant, "b": size})
        else:
            self._execute(cur, "DELETE FROM sentdp_idempotency " + _OWNED_KEY, params)  # noqa: S608 (constants)

    def _stored_bytes(self, cur: Any, tenant: str) -> int:
        row = self._execute(
            cur, "SELECT bytes FROM sentdp_stored_replies WHERE tenant = :t", {"t": tenant}
        ).fetchone()
        return 0 if row is None else int(row[0])

    def record_period_ends(self, tenant: str, policy: Policy, now: float | None = None) -> int:
        """Give accounts of ``tenant`` whose period has no recorded end (written before
        schema 4, or by an older sentdp) and opened in the window ``now`` falls in under
        ``policy`` (the tenant's period length now) that window's end; returns how many
        (none without automatic renewal). Idempotent; run at every start-up. Accounts of
        earlier windows are left to renew at their next request: their index may be in
        units of another length, and an end computed from it could lie centuries away.
        ``now`` defaults to the ledger's clock."""
        with self.transaction() as cur:
            now = self._now(cur) if now is None else now
            window, end = policy.window(now), policy.window_end(now)
            if window is None:
                return 0
            updated = self._execute(
                cur,
                "UPDATE sentdp_accounts SET period_ends = :e WHERE tenant = :t "
                "AND period_ends IS NULL AND period_window = :w",
                {"t": tenant, "w": window, "e": end},
            ).rowcount
        return max(int(updated), 0)

    def new_period(self, tenant: str, user: str) -> Account:
        """Operator command: start a new accounting period (Σε back to 0) for one user."""
        with self.transaction() as cur:
            self._execute(
                cur,
                "UPDATE sentdp_accounts SET spent_micro = 0, documents = 0, spend_units = 0, "
                "accountant = NULL, period = period + 1 WHERE tenant = :t AND user_id = :u",
                {"t": tenant, "u": user},
            )
            return self._account(cur, tenant, user)

    def prune_history(self, older_than: float, chunk: int = PRUNE_CHUNK_ROWS) -> dict[str, int]:
        """Operator command: delete the record of what no budget check reads any more, and
        how many rows of each kind went. Charge rows settled (final or refunded) more than
        ``older_than`` seconds ago by the ledger's clock, and per-document spends of periods
        before their account's current one. Reserved charges and the current period's spends
        still count, so they stay; an account's spend is its own row's and does not move.
        In transactions of at most ``chunk`` rows, each resuming after the last one's rows,
        so writers wait briefly; on PostgreSQL rows another transaction holds are skipped
        (a refund locks a past period's spends in its own order), not waited for."""
        if not older_than >= 0:
            raise ValueError("older_than must be at least 0 seconds")
        if chunk < 1:
            raise ValueError("chunk must be at least 1 row")
        skip = self._skip_locked_clause()
        with self.transaction() as cur:
            cutoff = self._now(cur) - older_than
        deleted = {"charges": 0, "documents": 0}
        after: Any = 0
        while True:
            with self.transaction() as cur:
                rows = self._execute(
                    cur,
                    "DELETE FROM sentdp_charges WHERE id IN (SELECT id FROM sentdp_charges "  # noqa: S608 (constants)
                    "WHERE id > :after AND state IN ('final', 'refunded') "
                    "AND settled_at IS NOT NULL AND settled_at < :c ORDER BY id LIMIT :n"
                    f"{skip}) RETURNING id",
                    {"after": after, "c": cutoff, "n": chunk},
                ).fetchall()
            deleted["charges"] += len(rows)
            if len(rows) < chunk:
                break
            after = max(int(r[0]) for r in rows)
        key = "(d.tenant, d.user_id, d.period, d.document_id)"
        resume = ""
        last: dict[str, Any] = {}
        while True:
            # periods only grow, so a period below the account's, read at any moment, is past
            with self.transaction() as cur:
                rows = self._execute(
                    cur,
                    "DELETE FROM sentdp_documents WHERE (tenant, user_id, period, document_id) "  # noqa: S608 (constants)
                    f"IN (SELECT {key[1:-1]} FROM sentdp_documents d JOIN sentdp_accounts a "
                    "ON a.tenant = d.tenant AND a.user_id = d.user_id "
                    f"WHERE d.period < a.period{resume} ORDER BY {key[1:-1]} LIMIT :n"
                    f"{skip.replace('UPDATE', 'UPDATE OF d')}) "
                    "RETURNING tenant, user_id, period, document_id",
                    {"n": chunk, **last},
                ).fetchall()
            deleted["documents"] += len(rows)
            if len(rows) < chunk:
                break
            # the next chunk starts after this chunk's largest key in Python's order, which is
            # SQLite's; where PostgreSQL collates text otherwise, that key is still one of
            # this chunk's rows, so the next chunk can only start early (over rows just
            # deleted or held by others), never past a row it should take
            t, u, period, d = max(tuple(r) for r in rows)
            last = {"lt": t, "lu": u, "lp": period, "ld": d}
            resume = f" AND {key} > (:lt, :lu, :lp, :ld)"
        return deleted

    def charges(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """Every charge row (for audits and tests), oldest first."""
        sql = (
            "SELECT id, tenant, user_id, period, micro, state, request_id, units, document_id "
            "FROM sentdp_charges"
        )
        params: dict[str, Any] = {}
        if tenant is not None:
            sql += " WHERE tenant = :t"
            params["t"] = tenant
        with self.transaction() as cur:
            rows = self._execute(cur, sql + " ORDER BY id", params).fetchall()
        names = [
            "id",
            "tenant",
            "user",
            "period",
            "micro",
            "state",
            "request_id",
            "units",
            "document",
        ]
        return [dict(zip(names, row, strict=True)) for row in rows]

    def accounts(self) -> list[Account]:
        with self.transaction() as cur:
            rows = self._execute(
                cur,
                "SELECT tenant, user_id, spent_micro, documents, period, spend_units, accountant "
                "FROM sentdp_accounts ORDER BY tenant, user_id",
            ).fetchall()
        return [
            Account(r[0], r[1], int(r[2]), int(r[3]), int(r[4]), int(r[5] or 0), r[6]) for r in rows
        ]


def to_named_pyformat(sql: str) -> str:
    """``:name`` placeholders to psycopg's ``%(name)s``."""
    return _NAMED.sub(r"%(\1)s", sql)
