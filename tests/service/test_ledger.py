"""One contract for both ledger backends: SQLite file and PostgreSQL schema."""

from __future__ import annotations

import math
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sentdp.accounting import MICRO, Charge, Policy
from service.ledger import (
    IDEMPOTENCY_TTL_SECONDS,
    BudgetExhaustedError,
    IdempotencyInFlightError,
    IdempotencyKey,
    IdempotencyMismatchError,
    Replay,
    Reservation,
    SqlLedger,
    StoredReplies,
    open_ledger,
)
from tests.support import age_pending_keys, ledger_files_hold

ONE = Charge("deepcandidate", MICRO, 1)
POLICY = Policy(group_size=2, limit_micro=10 * MICRO)  # admits five charges of epsilon 1


@pytest.fixture
def ledger(ledger_url: tuple[str, str]) -> SqlLedger:
    url, schema = ledger_url
    opened = open_ledger(url, schema)
    yield opened
    opened.close()


def reserve(ledger: SqlLedger, user: str = "alice", charge: Charge = ONE, **kwargs) -> Reservation:
    result = ledger.reserve("acme", user, charge, POLICY, "req", **kwargs)
    assert isinstance(result, Reservation)
    return result


def assert_invariant(ledger: SqlLedger) -> None:
    """spent = sum of the period's charges that are not refunded, for every account."""
    charges = ledger.charges()
    for account in ledger.accounts():
        counted = sum(
            c["micro"]
            for c in charges
            if (c["tenant"], c["user"], c["period"])
            == (account.tenant, account.user, account.period)
            and c["state"] != "refunded"
        )
        assert account.spent_micro == counted


def test_debits_are_admitted_up_to_exactly_the_group_budget(ledger: SqlLedger) -> None:
    for expected in range(1, 6):
        assert reserve(ledger).account.spent_micro == expected * MICRO
    with pytest.raises(BudgetExhaustedError) as refused:
        reserve(ledger)
    assert refused.value.account.spent_micro == 5 * MICRO
    assert refused.value.policy == POLICY
    assert ledger.account("acme", "alice").spent_micro == 5 * MICRO
    assert len(ledger.charges()) == 5
    assert_invariant(ledger)


def test_one_micro_epsilon_over_the_remainder_is_refused(ledger: SqlLedger) -> None:
    reserve(ledger, charge=Charge("deepcandidate", 4 * MICRO, 1))
    with pytest.raises(BudgetExhaustedError):
        reserve(ledger, charge=Charge("deepcandidate", MICRO + 1, 1))
    assert (
        reserve(ledger, charge=Charge("deepcandidate", MICRO, 1)).account.spent_micro == 5 * MICRO
    )


def test_a_multi_document_request_is_admitted_whole_or_not_at_all(ledger: SqlLedger) -> None:
    reserve(ledger, charge=Charge("deepcandidate", MICRO, 3))
    with pytest.raises(BudgetExhaustedError):
        reserve(ledger, charge=Charge("deepcandidate", MICRO, 3))
    assert ledger.account("acme", "alice").documents == 3
    assert len(ledger.charges()) == 3


def test_refunds_restore_reserved_charges_once_and_never_final_ones(ledger: SqlLedger) -> None:
    first = reserve(ledger, charge=Charge("deepcandidate", MICRO, 2))
    ledger.settle("acme", "alice", final=[first.charge_ids[0]], refund=[first.charge_ids[1]])
    assert ledger.account("acme", "alice").spent_micro == MICRO
    ledger.settle("acme", "alice", final=[], refund=first.charge_ids)  # again, and the final one
    assert ledger.account("acme", "alice").spent_micro == MICRO
    states = [c["state"] for c in ledger.charges()]
    assert states == ["final", "refunded"]
    assert_invariant(ledger)


def test_a_settlement_moves_only_its_own_users_charges(ledger: SqlLedger) -> None:
    """Charge ids come from the request's own reservation; a wrong one must still neither
    finalise nor refund (and credit) another user's charge."""
    alice = reserve(ledger, "alice")
    bob = reserve(ledger, "bob")
    ledger.settle("acme", "alice", final=[bob.charge_ids[0]], refund=[])
    ledger.settle("other", "bob", final=[], refund=[bob.charge_ids[0]])
    ledger.settle("acme", "alice", final=[], refund=[bob.charge_ids[0]])
    assert [c["state"] for c in ledger.charges()] == ["reserved", "reserved"]
    assert ledger.account("acme", "bob").spent_micro == MICRO
    ledger.settle("acme", "bob", final=[], refund=bob.charge_ids)
    ledger.settle("acme", "alice", final=alice.charge_ids, refund=[])
    assert [c["state"] for c in ledger.charges()] == ["final", "refunded"]
    assert_invariant(ledger)


def test_a_failing_purge_does_not_fail_the_reservation_it_rides_on(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Purging expired keys is housekeeping (a reviewer saw two purges and a key claim
    deadlock on PostgreSQL): the request that triggered it is reserved all the same."""

    def deadlocked(now: float | None = None, limit: int | None = None) -> int:
        raise RuntimeError("deadlock detected")

    monkeypatch.setattr(ledger, "purge_expired", deadlocked)
    reserve(ledger)
    assert ledger.account("acme", "alice").spent_micro == MICRO


def test_tenants_and_users_have_separate_accounts(ledger: SqlLedger) -> None:
    reserve(ledger, "bob")
    ledger.reserve("other", "bob", ONE, POLICY, "req")
    ledger.reserve("other", "bob", ONE, POLICY, "req")
    assert ledger.account("acme", "bob").spent_micro == MICRO
    assert ledger.account("other", "bob").spent_micro == 2 * MICRO
    assert ledger.account("acme", "carol").spent_micro == 0


def test_a_completed_key_replays_its_response_without_charging(ledger: SqlLedger) -> None:
    key = IdempotencyKey("k1", "hmac-a")
    first = reserve(ledger, idempotency=key)
    ledger.settle("acme", "alice", first.charge_ids, [], key, response='{"ok": 1}')
    again = ledger.reserve("acme", "alice", ONE, POLICY, "req", idempotency=key)
    assert again == Replay('{"ok": 1}')
    assert ledger.account("acme", "alice").spent_micro == MICRO


def test_a_key_in_flight_gets_409_and_a_different_body_422(ledger: SqlLedger) -> None:
    key = IdempotencyKey("k1", "hmac-a")
    reserve(ledger, idempotency=key)
    with pytest.raises(IdempotencyInFlightError):
        ledger.reserve("acme", "alice", ONE, POLICY, "req", idempotency=key)
    with pytest.raises(IdempotencyMismatchError):
        ledger.reserve(
            "acme", "alice", ONE, POLICY, "req", idempotency=IdempotencyKey("k1", "hmac-b")
        )
    assert ledger.account("acme", "alice").spent_micro == MICRO
    # The same key under another user or tenant is another key.
    reserve(ledger, "bob", idempotency=key)


def test_a_refused_or_refunded_request_leaves_its_key_free(ledger: SqlLedger) -> None:
    key = IdempotencyKey("k1", "hmac-a")
    big = Charge("deepcandidate", 6 * MICRO, 1)
    with pytest.raises(BudgetExhaustedError):
        reserve(ledger, charge=big, idempotency=key)
    first = reserve(ledger, idempotency=key)
    ledger.settle("acme", "alice", [], first.charge_ids, key, response=None)
    assert ledger.account("acme", "alice").spent_micro == 0
    second = reserve(ledger, idempotency=key)
    assert second.account.spent_micro == MICRO


def test_abandoned_pending_keys_are_processed_as_new_requests(ledger_url: tuple[str, str]) -> None:
    ledger = open_ledger(*ledger_url, pending_timeout=60)
    key = IdempotencyKey("k1", "hmac-a")
    reserve(ledger, idempotency=key)
    age_pending_keys(ledger, 120)
    assert reserve(ledger, idempotency=key).account.spent_micro == 2 * MICRO
    ledger.close()


def test_an_abandoned_key_belongs_to_whoever_took_it_over(ledger_url: tuple[str, str]) -> None:
    ledger = open_ledger(*ledger_url, pending_timeout=60)
    key = IdempotencyKey("k1", "hmac-a")
    first = ledger.reserve("acme", "alice", ONE, POLICY, "req-a", key)
    age_pending_keys(ledger, 120)  # the first request's key is abandoned; the second's is not
    with pytest.raises(IdempotencyMismatchError):  # only an expired key may change body
        ledger.reserve("acme", "alice", ONE, POLICY, "req-x", IdempotencyKey("k1", "hmac-b"))
    second = ledger.reserve("acme", "alice", ONE, POLICY, "req-b", key)
    assert isinstance(first, Reservation)
    assert isinstance(second, Reservation)
    # The slow first request finishes: it must neither store over nor release the new owner's key.
    ledger.settle("acme", "alice", first.charge_ids, [], key, '{"first": 1}', 200, "req-a")
    with pytest.raises(IdempotencyInFlightError):
        ledger.reserve("acme", "alice", ONE, POLICY, "req-c", key)
    ledger.settle("acme", "alice", second.charge_ids, [], key, '{"second": 2}', 200, "req-b")
    assert ledger.reserve("acme", "alice", ONE, POLICY, "req-d", key) == Replay('{"second": 2}')
    ledger.close()


def test_new_period_starts_from_zero_and_old_refunds_do_not_touch_it(ledger: SqlLedger) -> None:
    old = reserve(ledger)
    account = ledger.new_period("acme", "alice")
    assert (account.spent_micro, account.period) == (0, 1)
    ledger.settle("acme", "alice", [], old.charge_ids)
    assert ledger.account("acme", "alice").spent_micro == 0


def test_a_version_1_database_is_upgraded_in_place(ledger_url: tuple[str, str]) -> None:
    """A v1 ledger (no status column, its HMAC secret in sentdp_meta) keeps its rows, gains
    the column, and gives its secret up to the secret file."""
    first = open_ledger(*ledger_url)
    reserve(first, idempotency=IdempotencyKey("old", "h"))
    with first.transaction() as cur:
        first._execute(cur, "DROP INDEX IF EXISTS sentdp_idempotency_created")
        first._execute(cur, "ALTER TABLE sentdp_idempotency DROP COLUMN status")
        first._execute(cur, "UPDATE sentdp_meta SET value = '1' WHERE key = 'schema_version'")
        first._execute(cur, "UPDATE sentdp_accounts SET spend_units = NULL")  # before v3
        first._execute(cur, "UPDATE sentdp_charges SET units = NULL")
        first._execute(cur, "INSERT INTO sentdp_meta VALUES ('hmac_secret', :v)", {"v": "ab" * 32})
    first.close()
    upgraded = open_ledger(*ledger_url)
    with upgraded.transaction() as cur:
        version = upgraded._execute(
            cur, "SELECT value FROM sentdp_meta WHERE key = 'schema_version'"
        ).fetchone()[0]
        assert "status" in upgraded._columns(cur, "sentdp_idempotency")
    assert version == "5"
    upgraded_account = upgraded.account("acme", "alice")
    assert (upgraded_account.spent_micro, upgraded_account.spend_units) == (MICRO, MICRO)
    assert [c["units"] for c in upgraded.charges()] == [MICRO]
    assert upgraded.legacy_hmac_secret() == bytes.fromhex("ab" * 32)
    upgraded.forget_legacy_hmac_secret()
    assert upgraded.legacy_hmac_secret() is None
    upgraded.close()


def test_a_replay_carries_the_status_it_was_stored_with(ledger: SqlLedger) -> None:
    key = IdempotencyKey("k", "h")
    first = reserve(ledger, idempotency=key)
    ledger.settle("acme", "alice", first.charge_ids, [], key, '{"error": {}}', 503)
    replay = ledger.reserve("acme", "alice", ONE, POLICY, "req", key)
    assert replay == Replay('{"error": {}}', 503)


def test_a_key_signed_under_a_rotated_out_secret_still_matches(ledger: SqlLedger) -> None:
    reserve(ledger, idempotency=IdempotencyKey("k", "old-hmac"))
    rotated = IdempotencyKey("k", "new-hmac", previous_hmacs=("old-hmac",))
    with pytest.raises(IdempotencyInFlightError):  # same body: in flight, not a mismatch
        ledger.reserve("acme", "alice", ONE, POLICY, "req", rotated)
    with pytest.raises(IdempotencyMismatchError):
        ledger.reserve("acme", "alice", ONE, POLICY, "req", IdempotencyKey("k", "other"))


def test_expired_idempotency_rows_are_purged(ledger: SqlLedger) -> None:
    key = IdempotencyKey("k", "h")
    first = reserve(ledger, idempotency=key)
    ledger.settle("acme", "alice", first.charge_ids, [], key, "{}")
    reserve(ledger, idempotency=IdempotencyKey("fresh", "h"))
    assert ledger.purge_expired() == 0
    assert ledger.purge_expired(now=time.time() + IDEMPOTENCY_TTL_SECONDS + 60) == 2
    with ledger.transaction() as cur:
        left = ledger._execute(cur, "SELECT COUNT(*) FROM sentdp_idempotency").fetchone()[0]
    assert left == 0
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO  # charges are kept


def test_stored_replies_are_counted_per_tenant_and_freed_when_they_go(ledger: SqlLedger) -> None:
    """Each tenant's stored reply bytes: added when a reply is stored, taken off when its row
    is purged or an expired key is taken over; refunded requests store nothing."""
    a, b = IdempotencyKey("a", "h"), IdempotencyKey("b", "h")
    first = reserve(ledger, idempotency=a)
    ledger.settle("acme", "alice", first.charge_ids, [], a, '{"reply": "é"}')  # 15 bytes
    second = reserve(ledger, "bob", idempotency=b)
    ledger.settle("acme", "bob", second.charge_ids, [], b, "x" * 100)
    other = ledger.reserve("zenith", "alice", ONE, POLICY, "z", idempotency=a)
    ledger.settle("zenith", "alice", other.charge_ids, [], a, "y" * 40)
    refunded = reserve(ledger, idempotency=IdempotencyKey("c", "h"))
    ledger.settle("acme", "alice", [], refunded.charge_ids, IdempotencyKey("c", "h"), None)
    assert (ledger.stored_reply_bytes("acme"), ledger.stored_reply_bytes("zenith")) == (115, 40)
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 60)
    taken_over = reserve(ledger, idempotency=a)  # the expired key's reply goes with it
    assert ledger.stored_reply_bytes("acme") == 100
    assert ledger.purge_expired(limit=1) == 1  # bob's (the oldest), in a chunk
    assert ledger.stored_reply_bytes("acme") == 0
    assert ledger.purge_expired() == 1  # zenith's; alice's key is fresh again
    assert (ledger.stored_reply_bytes("acme"), ledger.stored_reply_bytes("zenith")) == (0, 0)
    ledger.settle("acme", "alice", taken_over.charge_ids, [], a, "z" * 7)
    assert ledger.stored_reply_bytes("acme") == 7


def test_stored_reply_bytes_are_counted_from_the_rows_on_upgrade_and_on_demand(
    ledger_url: tuple[str, str],
) -> None:
    """Replies stored before schema 5 were never counted, so a ledger upgraded to it is
    counted once from its rows; a count an older replica left wrong later (it purged counted
    rows without lowering it) is set again by ``recount_stored_replies``
    (``sentdp-admin recount-replies``), not by every start (a scan of every key while the
    count's writers wait)."""
    ledger = open_ledger(*ledger_url)
    key = IdempotencyKey("a", "h")
    reserved = reserve(ledger, idempotency=key)
    ledger.settle("acme", "alice", reserved.charge_ids, [], key, "x" * 30)

    def miscount() -> None:
        with ledger.transaction() as cur:
            ledger._execute(cur, "UPDATE sentdp_stored_replies SET bytes = 2000")
            ledger._execute(
                cur, "INSERT INTO sentdp_stored_replies VALUES ('gone', 500) ON CONFLICT DO NOTHING"
            )

    miscount()
    with ledger.transaction() as cur:  # as a schema-4 ledger records itself
        ledger._execute(cur, "UPDATE sentdp_meta SET value = '4' WHERE key = 'schema_version'")
    upgraded = open_ledger(*ledger_url)
    assert (upgraded.stored_reply_bytes("acme"), upgraded.stored_reply_bytes("gone")) == (30, 0)
    miscount()
    restarted = open_ledger(*ledger_url)
    assert restarted.stored_reply_bytes("acme") == 2000  # a start does not scan
    restarted.recount_stored_replies()
    assert (restarted.stored_reply_bytes("acme"), restarted.stored_reply_bytes("gone")) == (30, 0)
    for opened in (ledger, upgraded, restarted):
        opened.close()


def test_a_reply_past_the_tenants_bound_is_kept_as_its_stand_in(ledger: SqlLedger) -> None:
    """Past ``StoredReplies.limit`` a reply is stored as the stand-in: its key stays done (a
    retry replays the stand-in and is never charged again), the charges stay final, and
    another tenant's replies are kept whole."""
    kept = StoredReplies(limit=150, instead='{"error": "not kept"}', instead_status=410)
    keys = [IdempotencyKey(f"k{n}", "h") for n in range(3)]
    for key in keys:
        reserved = reserve(ledger, idempotency=key)
        ledger.settle(
            "acme", "alice", reserved.charge_ids, [], key, "r" * 100, 200, "req", kept=kept
        )
    zenith = ledger.reserve("zenith", "alice", ONE, POLICY, "z", idempotency=keys[0])
    ledger.settle("zenith", "alice", zenith.charge_ids, [], keys[0], "r" * 100, kept=kept)
    replays = [ledger.reserve("acme", "alice", ONE, POLICY, "req", key) for key in keys]
    assert replays[0] == Replay("r" * 100)
    assert replays[1:] == [Replay('{"error": "not kept"}', 410)] * 2
    assert ledger.stored_reply_bytes("acme") == 100 + 2 * len('{"error": "not kept"}')
    assert ledger.reserve("zenith", "alice", ONE, POLICY, "z", keys[0]) == Replay("r" * 100)
    assert ledger.account("acme", "alice").spent_micro == 3 * MICRO
    assert [c["state"] for c in ledger.charges("acme")] == ["final"] * 3


def test_expired_keys_are_purged_a_chunk_per_reservation(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A minute's expired keys are not deleted in one transaction that every other ledger
    call waits for: each reservation deletes at most a chunk, oldest first, and while chunks
    come back full the next reservation deletes the next one."""
    import service.ledger.sql as sql

    monkeypatch.setattr(sql, "PURGE_CHUNK_ROWS", 3)
    for n in range(7):  # a user each: the budget is small
        reserve(ledger, f"user-{n}", idempotency=IdempotencyKey(f"k{n}", "h"))
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 120)
    reserve(ledger, "user-7", idempotency=IdempotencyKey("fresh", "h"))  # in the same minute

    def keys() -> list[str]:
        with ledger.transaction() as cur:
            rows = ledger._execute(cur, "SELECT key FROM sentdp_idempotency").fetchall()
        return sorted(row[0] for row in rows)

    assert len(keys()) == 8
    ledger._last_purge = -math.inf  # a minute later
    left = []
    for n in range(4):
        reserve(ledger, f"later-{n}")
        left.append(len(keys()))
    assert left == [5, 2, 1, 1]  # 3, 3, then the last expired one; "fresh" stays
    assert keys() == ["fresh"]


def test_a_purge_is_due_once_a_minute_without_any_reservation(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's housekeeping timer calls purge_due with no request to ride on: expired
    rows go, fresh ones stay, at most once a minute, and at once again after a full chunk."""
    import service.ledger.sql as sql

    monkeypatch.setattr(sql, "PURGE_CHUNK_ROWS", 3)
    for n in range(4):
        reserve(ledger, f"user-{n}", idempotency=IdempotencyKey(f"k{n}", "h"))
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 120)
    reserve(ledger, "user-4", idempotency=IdempotencyKey("fresh", "h"))  # purges nothing yet
    ledger._last_purge = -math.inf  # its minute has passed
    start = time.monotonic()
    assert ledger.purge_due(start) == 3  # a full chunk: the next call need not wait
    assert ledger.purge_due(start + 1) == 1
    assert ledger.purge_due(start + 2) == 0  # not due for a minute
    with ledger.transaction() as cur:
        rows = ledger._execute(cur, "SELECT key FROM sentdp_idempotency").fetchall()
    assert [row[0] for row in rows] == ["fresh"]
    assert ledger.account("acme", "user-0").spent_micro == MICRO  # charges are kept


def test_the_timer_s_purge_leaves_no_byte_of_a_purged_reply_in_the_sqlite_files(
    tmp_path: Path,
) -> None:
    """A backup that copies the ledger's files after the purge holds no expired reply: the
    timer's housekeep checkpoints and truncates the WAL after deleting rows, and
    secure_delete has zeroed them (without the checkpoint the reply stayed in the file)."""
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    key = IdempotencyKey("expired", "h")
    first = reserve(ledger, idempotency=key)
    ledger.settle("acme", "alice", first.charge_ids, [], key, '{"e": "REPLY-MARKER' + "x" * 2000)
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 60)
    ledger.scrub()  # the reply is in the database file, as an older backup would hold it
    assert ledger_files_hold(tmp_path, b"REPLY-MARKER")
    ledger._last_purge = -math.inf
    assert ledger.housekeep() == 1
    assert not ledger_files_hold(tmp_path, b"REPLY-MARKER")
    assert ledger.housekeep() == 0  # not due again for a minute
    ledger.close()


def test_a_scrub_waits_for_the_last_full_chunk_and_for_its_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While full chunks come back the timer purges on at once without a checkpoint each
    time (every one holds writers back); the rows' bytes go with the last chunk's scrub, and
    a key taken over after its window owes a scrub too."""
    import service.ledger.sql as sql

    monkeypatch.setattr(sql, "PURGE_CHUNK_ROWS", 2)
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    scrubs: list[float | None] = []
    real = ledger.scrub
    monkeypatch.setattr(ledger, "scrub", lambda wait=None: scrubs.append(wait) or real(wait))
    for n in range(3):
        key = IdempotencyKey(f"k{n}", "h")
        done = reserve(ledger, f"user-{n}", idempotency=key)
        ledger.settle("acme", f"user-{n}", done.charge_ids, [], key, '"REPLY-MARKER"')
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 60)
    ledger._last_purge = -math.inf
    assert ledger.housekeep() == 2  # a full chunk: no scrub yet
    assert scrubs == []
    assert ledger.housekeep() == 1
    assert scrubs == [sql.SCRUB_WAIT_SECONDS]
    assert not ledger_files_hold(tmp_path, b"REPLY-MARKER")
    key = IdempotencyKey("again", "h")
    done = reserve(ledger, "user-9", idempotency=key)
    ledger.settle("acme", "user-9", done.charge_ids, [], key, '"REPLY-MARKER"')
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 60)
    ledger.settle("acme", "user-9", reserve(ledger, "user-9", idempotency=key).charge_ids, [])
    assert ledger.housekeep() == 0  # the key was taken over, not purged: a scrub is owed
    assert len(scrubs) == 1  # but not within the minute of the last one
    ledger._last_scrub = -math.inf
    assert ledger.housekeep() == 0
    assert len(scrubs) == 2
    assert not ledger_files_hold(tmp_path, b"REPLY-MARKER")
    ledger.close()


def test_a_long_read_makes_the_timer_s_checkpoint_give_up_and_try_again(tmp_path: Path) -> None:
    """The checkpoint holds new writers back while it waits for readers, so it waits at most
    SCRUB_WAIT_SECONDS for a long read (a backup), and scrubs at the next call instead."""
    import sqlite3

    from service.ledger.sql import SCRUB_WAIT_SECONDS

    path = tmp_path / "ledger.sqlite3"
    ledger = open_ledger(f"sqlite:///{path}")
    key = IdempotencyKey("expired", "h")
    first = reserve(ledger, idempotency=key)
    ledger.settle("acme", "alice", first.charge_ids, [], key, '{"e": "REPLY-MARKER' + "x" * 2000)
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 60)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM sentdp_idempotency").fetchone()  # holds a snapshot
    ledger._last_purge = -math.inf
    started = time.monotonic()
    assert ledger.housekeep() == 1
    assert time.monotonic() - started < SCRUB_WAIT_SECONDS + 2.0  # not busy_timeout's 30 s
    reserve(ledger, "bob")  # writers go on
    reader.execute("COMMIT")
    reader.close()
    assert ledger.housekeep() == 0  # the scrub it owes waits for its minute
    assert ledger_files_hold(tmp_path, b"REPLY-MARKER")
    ledger._last_scrub = -math.inf  # a minute later
    assert ledger.housekeep() == 0  # no purge due, but the scrub it owes runs now
    assert not ledger_files_hold(tmp_path, b"REPLY-MARKER")
    ledger.close()


def test_settling_twice_moves_nothing_more_and_counts_a_reply_once(ledger: SqlLedger) -> None:
    """The gateway tries a failed settlement again; if the first attempt had committed, the
    second must change nothing: no charge moves again and the reply's bytes count once."""
    key = IdempotencyKey("k", "h")
    first = reserve(ledger, idempotency=key)
    for _ in range(2):
        ledger.settle("acme", "alice", first.charge_ids, [], key, "r" * 100, 200, "req")
    assert [c["state"] for c in ledger.charges()] == ["final"]
    assert ledger.stored_reply_bytes("acme") == 100
    assert ledger.reserve("acme", "alice", ONE, POLICY, "req", key) == Replay("r" * 100)
    assert ledger.account("acme", "alice").spent_micro == MICRO
    assert_invariant(ledger)


def test_a_settlement_with_a_lock_timeout_gives_up_on_a_held_row(
    ledger_url: tuple[str, str],
) -> None:
    """The gateway's second attempt at a settlement bounds its lock waits: a first attempt's
    session that outlived its connection (holding the user's rows) makes it give up, not
    wait for hours; without the bound it waits, and it settles once the rows are free."""
    import threading

    url, schema = ledger_url
    if not url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: SQLite's writers wait out their busy timeout")
    ledger, holder = open_ledger(url, schema), open_ledger(url, schema)
    first = reserve(ledger)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.transaction() as cur:
            holder._execute(cur, "SELECT 1 FROM sentdp_accounts WHERE tenant = 'acme' FOR UPDATE")
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        with pytest.raises(Exception, match="lock"):
            ledger.settle("acme", "alice", first.charge_ids, [], lock_timeout=0.2)
        assert time.monotonic() - started < 5
        assert [c["state"] for c in ledger.charges()] == ["reserved"]  # still counted
    finally:
        release.set()
        thread.join()
    ledger.settle("acme", "alice", first.charge_ids, [], lock_timeout=0.2)
    assert [c["state"] for c in ledger.charges()] == ["final"]
    ledger.close()
    holder.close()


def test_concurrent_threads_never_overspend(ledger: SqlLedger) -> None:
    policy = Policy(group_size=1, limit_micro=50 * MICRO)

    def attempt(_: int) -> int:
        try:
            ledger.reserve("acme", "alice", ONE, policy, "req")
        except BudgetExhaustedError:
            return 0
        return 1

    with ThreadPoolExecutor(8) as pool:
        admitted = sum(pool.map(attempt, range(200)))
    assert admitted == 50
    assert ledger.account("acme", "alice").spent_micro == 50 * MICRO
    assert_invariant(ledger)


def _hammer(url: str, schema: str, attempts: int, out: multiprocessing.Queue) -> None:
    ledger = open_ledger(url, schema)
    policy = Policy(group_size=1, limit_micro=50 * MICRO)
    won = 0
    for _ in range(attempts):
        try:
            ledger.reserve("acme", "alice", ONE, policy, "req")
            won += 1
        except BudgetExhaustedError:
            pass
    out.put(won)


def test_concurrent_processes_never_overspend(ledger_url: tuple[str, str]) -> None:
    url, schema = ledger_url
    open_ledger(url, schema).close()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=_hammer, args=(url, schema, 40, queue)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert sum(queue.get(timeout=5) for _ in workers) == 50
    ledger = open_ledger(url, schema)
    assert ledger.account("acme", "alice").spent_micro == 50 * MICRO
    assert_invariant(ledger)
    ledger.close()


@pytest.mark.parametrize("group_size", [1, 2, 7])
def test_the_sql_admission_rule_is_the_python_one_at_its_boundaries(
    ledger: SqlLedger, group_size: int
) -> None:
    """Policy.admits and the ledger's SQL agree on every case around the exact limit."""
    limit = 10 * MICRO + 3
    policy = Policy(group_size=group_size, limit_micro=limit)
    edge = limit // group_size  # the largest spend + charge that fits
    cases = 0
    for total in (edge - 1, edge, edge + 1):
        for spent in (0, 1, total // 2, total - 1):
            charge = Charge("deepcandidate", total - spent, 1)
            user = f"u-{group_size}-{total}-{spent}"
            with ledger.transaction() as cur:
                ledger._execute(
                    cur,
                    "INSERT INTO sentdp_accounts (tenant, user_id, spent_micro, spend_units) "
                    "VALUES ('acme', :u, :s, :s)",
                    {"u": user, "s": spent},
                )
            try:
                ledger.reserve("acme", user, charge, policy, "req")
                admitted = True
            except BudgetExhaustedError:
                admitted = False
            assert admitted == policy.admits(spent, charge.total_micro), (spent, charge)
            cases += 1
    assert cases == 12


@pytest.mark.postgres
def test_a_dropped_postgres_connection_is_replaced_without_a_double_charge(
    ledger_url: tuple[str, str],
) -> None:
    url, schema = ledger_url
    if not url.startswith("postgres"):
        pytest.skip("PostgreSQL only")
    import psycopg

    ledger = open_ledger(url, schema)
    reserve(ledger)
    with ledger.transaction() as cur:
        pid = ledger._execute(cur, "SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    time.sleep(0.2)
    reserve(ledger)  # BEGIN fails on the dead connection; one retry on a new one
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO
    assert len(ledger.charges()) == 2
    ledger.close()


@pytest.mark.postgres
def test_replicas_on_postgresql_decide_on_the_databases_clock(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose own clock runs ahead (here by 400 s, past a 300 s pending window, and
    past the end of the current day's budget period) still finds another replica's key in
    flight, and opens no period early: every time the ledger decides by is the server's."""
    from types import SimpleNamespace

    from service.ledger import sql as ledger_sql

    url, schema = ledger_url
    if not url.startswith("postgres"):
        pytest.skip("PostgreSQL only: SQLite's replicas share one machine's clock")
    ledger = open_ledger(url, schema)
    daily = Policy(1, 2 * MICRO, period_seconds=86_400)
    key = IdempotencyKey("k", "h")
    ledger.reserve("acme", "alice", ONE, daily, "first", key)  # still running
    ledger.reserve("acme", "alice", ONE, daily, "second")  # the day's budget is spent
    real = time.time
    day_ends = (real() // 86_400 + 1) * 86_400
    ahead = max(400.0, day_ends - real() + 60)
    monkeypatch.setattr(
        ledger_sql, "time", SimpleNamespace(time=lambda: real() + ahead, monotonic=time.monotonic)
    )
    with pytest.raises(IdempotencyInFlightError):
        ledger.reserve("acme", "alice", ONE, daily, "skewed", key)
    with pytest.raises(BudgetExhaustedError):
        ledger.reserve("acme", "alice", ONE, daily, "skewed-2")
    assert ledger.account("acme", "alice", daily).period == 0
    assert ledger.purge_expired() == 0
    ledger.close()


def test_a_new_sqlite_ledger_file_is_private(tmp_path: Path) -> None:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.sqlite3'}")
    reserve(ledger)
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    for path in (tmp_path / "state").iterdir():
        assert path.stat().st_mode & 0o077 == 0, path  # the -wal and -shm files too
    ledger.close()


def test_sqlite_writers_of_every_process_take_turns_on_one_lock_file(tmp_path: Path) -> None:
    """A write transaction holds an exclusive flock of ``<ledger>.writers`` (another open
    of the file, as another process would make, cannot take it meanwhile) and gives it back
    when it ends, committed or not; with ``queue_writers=False`` it takes nothing."""
    import fcntl
    import os

    from service.ledger.sqlite import SqliteLedger

    path = tmp_path / "ledger.sqlite3"
    ledger = open_ledger(f"sqlite:///{path}")
    lock = Path(f"{path}.writers")

    def taken() -> bool:
        other = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # even a shared lock waits
        except BlockingIOError:
            return True
        finally:
            os.close(other)
        return False

    with ledger.transaction():
        assert taken()
    assert not taken()

    def failing_transaction() -> None:
        with ledger.transaction():
            assert taken()
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError, match="rolled back"):
        failing_transaction()
    assert not taken()
    assert lock.stat().st_mode & 0o077 == 0
    ledger.close()
    unqueued = SqliteLedger(path, queue_writers=False)
    with unqueued.transaction():
        assert not taken()
    unqueued.close()


def test_a_writer_gives_up_on_a_stuck_turn_like_sqlite_and_never_nests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A process holding the writers' turn (stopped, say) makes another writer fail with
    "database is locked" after busy_timeout, as SQLite would, not hang; once it lets go the
    ledger writes again. A transaction inside another on one thread is refused (its own
    turn would wait for itself). A lock file that cannot be opened leaves the writers to
    SQLite, with one warning."""
    import fcntl
    import os
    import sqlite3

    from service.ledger.sqlite import SqliteLedger

    path = tmp_path / "ledger.sqlite3"
    open_ledger(f"sqlite:///{path}").close()
    ledger = SqliteLedger(path, busy_timeout=0.3)
    holder = os.open(f"{path}.writers", os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        reserve(ledger)
    assert 0.25 < time.monotonic() - started < 5
    os.close(holder)  # the stuck process goes on (or dies)
    reserve(ledger)
    assert ledger.account("acme", "alice").spent_micro == MICRO

    def nested() -> None:
        with ledger.transaction(), ledger.transaction():
            pass

    with pytest.raises(RuntimeError, match="already open on this thread"):
        nested()
    reserve(ledger)  # the refused transaction left nothing held
    ledger.close()

    Path(f"{path}.writers").unlink()
    Path(f"{path}.writers").mkdir()  # cannot be opened as a file
    unqueued = SqliteLedger(path)
    with caplog.at_level("WARNING", logger="sentdp.service"):
        reserve(unqueued)
        reserve(unqueued)
    assert caplog.text.count("cannot take turns") == 1
    assert unqueued.account("acme", "alice").spent_micro == 4 * MICRO
    unqueued.close()


def test_replicas_starting_together_initialise_one_fresh_ledger(ledger_url) -> None:
    """Eight processes' worth of first connections at once, on a schema that does not exist
    yet: every one opens the ledger (PostgreSQL's concurrent CREATE ... IF NOT EXISTS fails on
    its catalog indexes unless schema changes take turns)."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    url, schema = ledger_url
    barrier = Barrier(8)

    def start(_: int) -> int:
        barrier.wait()
        return open_ledger(url, schema).account("t", "u").spent_micro

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(start, range(8))) == [0] * 8


def _age_settlements(ledger: SqlLedger, seconds: float, charge_ids: list[int]) -> None:
    """Make these charges' settlements (only: not their creation) ``seconds`` older."""
    with ledger.transaction() as cur:
        for charge_id in charge_ids:
            ledger._execute(
                cur,
                "UPDATE sentdp_charges SET settled_at = settled_at - :s WHERE id = :id",
                {"s": seconds, "id": charge_id},
            )


def test_pruning_history_deletes_only_what_no_budget_check_reads(ledger: SqlLedger) -> None:
    day = 86_400.0
    final, refunded, recent = reserve(ledger), reserve(ledger), reserve(ledger)
    ledger.settle("acme", "alice", final.charge_ids, [])
    ledger.settle("acme", "alice", [], refunded.charge_ids)
    ledger.settle("acme", "alice", recent.charge_ids, [])
    pending = reserve(ledger)  # never settled: it still counts
    old = [*final.charge_ids, *refunded.charge_ids]
    _age_settlements(ledger, 10 * day, old)
    with ledger.transaction() as cur:  # created long ago, settled lately, or never: kept
        ledger._execute(
            cur,
            "UPDATE sentdp_charges SET created_at = created_at - :s WHERE id IN (:a, :b)",
            {"s": 30 * day, "a": pending.charge_ids[0], "b": recent.charge_ids[0]},
        )
    before = ledger.account("acme", "alice")
    assert ledger.prune_history(7 * day, chunk=1) == {"charges": 2, "documents": 0}
    left = {c["id"]: c["state"] for c in ledger.charges()}
    assert left == {recent.charge_ids[0]: "final", pending.charge_ids[0]: "reserved"}
    assert ledger.account("acme", "alice") == before  # the spend is the account's own row
    assert ledger.prune_history(7 * day) == {"charges": 0, "documents": 0}
    # the budget still binds on the same spend: 3 charges of 2 each stand, 2 more fit
    reserve(ledger)
    reserve(ledger)
    with pytest.raises(BudgetExhaustedError):
        reserve(ledger)
    ledger.settle("acme", "alice", pending.charge_ids, [], None)  # a kept reservation settles
    assert {c["state"] for c in ledger.charges() if c["id"] == pending.charge_ids[0]} == {"final"}
    with pytest.raises(ValueError, match="at least 0"):
        ledger.prune_history(math.nan)
    with pytest.raises(ValueError, match="at least 1"):
        ledger.prune_history(0.0, chunk=0)


def test_pruning_keeps_the_current_periods_per_document_spends(ledger: SqlLedger) -> None:
    from sentdp.accounting import PER_DOCUMENT

    policy = Policy(group_size=1, limit_micro=3 * MICRO, composition=PER_DOCUMENT)

    def charge(document: str, tenant: str = "acme", settle: bool = True) -> Reservation:
        result = ledger.reserve(
            tenant, "bob", Charge("deepcandidate", MICRO, 1, (document,)), policy, "req"
        )
        assert isinstance(result, Reservation)
        if settle:
            ledger.settle(tenant, "bob", result.charge_ids, [])
        return result

    for _ in range(3):
        charge("d1")  # d1 is at the limit in period 0
    for document in ("d2", "d3", "d4"):
        charge(document)
    late = charge("d5", settle=False)  # still running when the period ends
    ledger.new_period("acme", "bob")
    for _ in range(2):
        charge("d1")  # period 1: d1 has spent 2 of 3
    # another tenant's "bob" is in a later period: it must not make acme's current one past
    charge("d1", tenant="other")
    ledger.new_period("other", "bob")
    ledger.new_period("other", "bob")
    assert ledger.prune_history(0.0, chunk=2) == {"charges": 9, "documents": 6}
    with ledger.transaction() as cur:
        rows = ledger._execute(
            cur,
            "SELECT tenant, period, document_id, spend_units FROM sentdp_documents ORDER BY tenant",
        ).fetchall()
    assert [(str(t), int(p), str(d), int(u)) for t, p, d, u in rows] == [
        ("acme", 1, "d1", 2 * MICRO)
    ]
    before = ledger.account("acme", "bob")
    ledger.settle("acme", "bob", [], late.charge_ids)  # a past period's refund moves nothing
    assert ledger.account("acme", "bob") == before
    charge("d1")  # the current period's spend still binds: one more, then refused
    with pytest.raises(BudgetExhaustedError):
        ledger.reserve("acme", "bob", Charge("deepcandidate", MICRO, 1, ("d1",)), policy, "req")


@pytest.mark.postgres
def test_pruning_on_postgresql_takes_every_row_where_text_collates_unlike_python(
    ledger_url: tuple[str, str],
) -> None:
    """A chunk resumes after its largest key in Python's order (code points). Under a
    collation where "a" < "B" < "c" < "D", unlike Python, one run must still take every
    past period's row, not skip those the database orders between."""
    from sentdp.accounting import PER_DOCUMENT

    url, schema = ledger_url
    if not url.startswith("postgresql"):
        pytest.skip("SQLite compares text as Python does")
    ledger = open_ledger(url, schema)
    with ledger.transaction() as cur:
        icu = ledger._execute(
            cur, "SELECT 1 FROM pg_collation WHERE collname = 'en-US-x-icu'"
        ).fetchone()
    if icu is None:
        ledger.close()
        pytest.skip("this PostgreSQL server was built without ICU collations")
    with ledger.transaction() as cur:
        columns = ledger._execute(
            cur,
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = :s AND data_type = 'text' "
            "AND table_name IN ('sentdp_accounts', 'sentdp_documents', 'sentdp_charges')",
            {"s": schema},
        ).fetchall()
        assert len(columns) >= 7
        for table, column in columns:
            ledger._execute(
                cur,
                f'ALTER TABLE {table} ALTER COLUMN {column} TYPE TEXT COLLATE "en-US-x-icu"',
            )
        ordered = ledger._execute(
            cur,
            "SELECT x FROM (VALUES ('c'), ('D'), ('a'), ('B')) v(x) "
            'ORDER BY x COLLATE "en-US-x-icu"',
        ).fetchall()
    assert [str(r[0]) for r in ordered] == ["a", "B", "c", "D"]  # unlike sorted(): B D a c
    policy = Policy(group_size=1, limit_micro=3 * MICRO, composition=PER_DOCUMENT)
    documents = ["c", "D", "a", "B", "e", "F"]
    for document in documents:
        result = ledger.reserve(
            "acme", "bob", Charge("deepcandidate", MICRO, 1, (document,)), policy, "req"
        )
        assert isinstance(result, Reservation)
        ledger.settle("acme", "bob", result.charge_ids, [])
    ledger.new_period("acme", "bob")
    assert ledger.prune_history(0.0, chunk=2) == {"charges": 6, "documents": 6}
    with ledger.transaction() as cur:
        left = ledger._execute(cur, "SELECT count(*) FROM sentdp_documents").fetchone()
    assert int(left[0]) == 0
    ledger.close()


@pytest.mark.postgres
def test_pruning_on_postgresql_skips_rows_another_transaction_holds(
    ledger_url: tuple[str, str],
) -> None:
    """A refund locks a past period's per-document spends in its own order; prune must not
    wait for them (the two could deadlock), only leave them for its next run."""
    import threading

    from sentdp.accounting import PER_DOCUMENT

    url, schema = ledger_url
    if not url.startswith("postgresql"):
        pytest.skip("SQLite has one writer at a time")
    ledger, holder = open_ledger(url, schema), open_ledger(url, schema)
    policy = Policy(group_size=1, limit_micro=3 * MICRO, composition=PER_DOCUMENT)
    for document in ("d1", "d2"):
        result = ledger.reserve(
            "acme", "bob", Charge("deepcandidate", MICRO, 1, (document,)), policy, "req"
        )
        assert isinstance(result, Reservation)
    ledger.new_period("acme", "bob")
    done: list[dict[str, int]] = []
    with holder.transaction() as cur:
        holder._execute(cur, "SELECT 1 FROM sentdp_documents WHERE document_id = 'd1' FOR UPDATE")
        pruning = threading.Thread(target=lambda: done.append(ledger.prune_history(0.0)))
        pruning.start()
        pruning.join(15)
        assert done == [{"charges": 0, "documents": 1}], "prune waited for a held row"
    assert ledger.prune_history(0.0) == {"charges": 0, "documents": 1}  # d1, once released
    ledger.close()
    holder.close()
