"""Each accountant of the ledger against a brute-force Python accountant, on random request
sequences: repeated ids inside one request, edits under one id, refunds before sampling,
finals, operator periods and periods rolling over on the clock; SQLite and PostgreSQL."""

from __future__ import annotations

import copy
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from sentdp.accounting import MICRO, PER_DOCUMENT, Charge, Policy
from service.ledger import BudgetExhaustedError, Reservation, SqlLedger, open_ledger
from service.ledger import sql as ledger_sql

EPSILONS = (0.5, 1.0, 2.5)
DAY = 86_400


@dataclass
class Model:
    """What the ledger must hold, computed the slow, obvious way."""

    policy: Policy
    period: int = 0
    epsilon_sum: int = 0
    documents: int = 0
    sequential: int = 0
    per_id: Counter = field(default_factory=Counter)

    def spend(self) -> int:
        if self.policy.composition == PER_DOCUMENT:
            return max(self.per_id.values(), default=0)
        return self.sequential

    def admits(self, charge: Charge) -> bool:
        units = self.policy.units(charge.micro)
        if self.policy.composition == PER_DOCUMENT:
            added = Counter(charge.document_ids)
            return all(self.policy.admits(self.per_id[d], units * n) for d, n in added.items())
        return self.policy.admits(self.sequential, units * charge.documents)

    def apply(self, charge: Charge, sign: int = 1, documents: tuple[str | None, ...] = ()) -> None:
        units = self.policy.units(charge.micro)
        count = len(documents) if sign < 0 else charge.documents
        self.epsilon_sum += sign * charge.micro * count
        self.documents += sign * count
        if self.policy.composition == PER_DOCUMENT:
            for document in documents if sign < 0 else charge.document_ids:
                self.per_id[document] += sign * units
        else:
            self.sequential += sign * units * count

    def renew(self) -> None:
        self.period += 1
        self.epsilon_sum = self.documents = self.sequential = 0
        self.per_id = Counter()


def run_sequence(ledger: SqlLedger, policy: Policy, seed: int, clock: list[float]) -> int:
    rng = random.Random(seed)
    model = Model(policy, period=ledger.account("acme", "u").period)
    open_charges: list[tuple[int, Charge, str | None, int]] = []  # (id, charge, doc, period)
    admitted = 0
    window_passed = window_known = False
    for step in range(120):
        action = rng.random()
        if action < 0.6:
            n = rng.randint(1, 4)
            micro = int(rng.choice(EPSILONS) * MICRO)
            ids = tuple(rng.choice("abcde") for _ in range(n))
            per_document = policy.composition == PER_DOCUMENT
            charge = Charge("deepcandidate", micro, n, ids if per_document else ())
            # The ledger renews at the first admitted request of a new window (a refused one
            # rolls back with everything else); the first request under a clock starts one.
            after = copy.deepcopy(model)
            if window_passed and window_known:
                after.renew()
            expected = after.admits(charge)
            try:
                reserved = ledger.reserve("acme", "u", charge, policy, f"r{step}")
            except BudgetExhaustedError:
                assert not expected, step
            else:
                assert expected, step
                assert isinstance(reserved, Reservation)
                model = after
                model.apply(charge)
                window_passed, window_known = False, policy.period_seconds is not None
                admitted += 1
                docs = charge.document_ids or (None,) * n
                open_charges += [
                    (i, charge, d, model.period)
                    for i, d in zip(reserved.charge_ids, docs, strict=True)
                ]
        elif action < 0.85 and open_charges:
            rng.shuffle(open_charges)
            chosen, open_charges = open_charges[:2], open_charges[2:]
            refunded = [c for c in chosen if rng.random() < 0.5]
            final = [c for c in chosen if c not in refunded]
            ledger.settle("acme", "u", [c[0] for c in final], [c[0] for c in refunded])
            for _, charge, document, period in refunded:
                if period == model.period:  # a refund never touches a later period
                    model.apply(charge, -1, (document,))
        elif action < 0.92:
            if policy.period_seconds:
                clock[0] += DAY  # a new window: the next request starts a new period
                window_passed = True
            else:
                ledger.new_period("acme", "u")
                model.renew()
        account = ledger.account("acme", "u")
        assert account.period == model.period, step
        assert (account.spent_micro, account.spend_units) == (model.epsilon_sum, model.spend()), (
            step
        )
        assert account.documents == model.documents, step
    return admitted


@pytest.mark.parametrize("accounting", ["pure", "zcdp"])
@pytest.mark.parametrize("composition", ["sequential", "per-document"])
def test_the_ledger_keeps_each_accountant_exactly(
    ledger_url: tuple[str, str], accounting: str, composition: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_000 * DAY + 5.0]
    monkeypatch.setattr(ledger_sql.SqlLedger, "_now", lambda self, cur: clock[0])
    ledger = open_ledger(*ledger_url)
    limit = 12 * MICRO if accounting == "pure" else MICRO  # a few releases each way
    for seed, period in ((1, None), (2, DAY)):
        policy = Policy(2, limit, accounting, composition, period)
        ledger.new_period("acme", "u")
        assert run_sequence(ledger, policy, seed, clock) > 5
    ledger.close()


@pytest.mark.parametrize("accounting", ["pure", "zcdp"])
@pytest.mark.parametrize("composition", ["sequential", "per-document"])
def test_200_concurrent_requests_spend_exactly_the_budget(
    ledger_url: tuple[str, str], accounting: str, composition: str
) -> None:
    """Budget for exactly 10 releases (of each document, per document) at the boundary."""
    from concurrent.futures import ThreadPoolExecutor

    ledger = open_ledger(*ledger_url)
    micro = MICRO
    probe = Policy(1, 1, accounting, composition)
    policy = Policy(1, 10 * probe.units(micro), accounting, composition)
    per_document = composition == PER_DOCUMENT

    def attempt(i: int) -> bool:
        ids = (f"doc-{i % 5}",) if per_document else ()
        try:
            ledger.reserve("acme", "crowd", Charge("deepcandidate", micro, 1, ids), policy, "r")
        except BudgetExhaustedError:
            return False
        return True

    with ThreadPoolExecutor(max_workers=24) as pool:
        admitted = sum(pool.map(attempt, range(200)))
    assert admitted == (50 if per_document else 10)
    account = ledger.account("acme", "crowd")
    assert account.spend_units == 10 * policy.units(micro)
    assert account.documents == admitted
    ledger.close()


def test_a_period_is_kept_by_one_accountant(ledger_url: tuple[str, str]) -> None:
    from service.ledger import AccountantChangedError

    ledger = open_ledger(*ledger_url)
    pure = Policy(1, 10 * MICRO)
    rho = Policy(1, 10 * MICRO, "zcdp")
    ledger.reserve("acme", "v", Charge("deepcandidate", MICRO, 1), pure, "r1")
    with pytest.raises(AccountantChangedError, match="pure-sequential"):
        ledger.reserve("acme", "v", Charge("deepcandidate", MICRO, 1), rho, "r2")
    ledger.new_period("acme", "v")  # the operator opens a new period: the new accountant keeps it
    ledger.reserve("acme", "v", Charge("deepcandidate", MICRO, 1), rho, "r3")
    account = ledger.account("acme", "v")
    assert (account.accountant, account.spend_units) == ("zcdp-sequential", MICRO // 8)
    ledger.close()


def test_concurrent_first_requests_of_a_window_renew_once(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    clock = [100 * DAY + 1.0]
    monkeypatch.setattr(ledger_sql.SqlLedger, "_now", lambda self, cur: clock[0])
    ledger = open_ledger(*ledger_url)
    policy = Policy(1, 100 * MICRO, period_seconds=DAY)
    ledger.reserve("acme", "w", Charge("deepcandidate", MICRO, 1), policy, "first")
    clock[0] += DAY  # every request below is among the first of a new window

    def attempt(i: int) -> None:
        ledger.reserve("acme", "w", Charge("deepcandidate", MICRO, 1), policy, f"r{i}")

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(attempt, range(40)))
    account = ledger.account("acme", "w")
    assert account.period == 1  # renewed exactly once
    assert (account.spend_units, account.documents) == (40 * MICRO, 40)  # no debit wiped out
    ledger.close()


def test_ids_must_match_the_accountant_at_the_ledger_too(ledger_url: tuple[str, str]) -> None:
    from sentdp.errors import InputError

    ledger = open_ledger(*ledger_url)
    with pytest.raises(InputError, match="one document id per document"):
        ledger.reserve(
            "acme",
            "z",
            Charge("deepcandidate", MICRO, 1),
            Policy(1, MICRO, "pure", PER_DOCUMENT),
            "r",
        )
    with pytest.raises(InputError, match="no document ids"):
        ledger.reserve(
            "acme", "z", Charge("deepcandidate", MICRO, 1, ("a",)), Policy(1, MICRO), "r"
        )
    assert ledger.charges() == []
    assert ledger.account("acme", "z").spend_units == 0
    ledger.close()


WEEK = 7 * DAY


def _clocked(monkeypatch: pytest.MonkeyPatch, start: float) -> list[float]:
    clock = [start]
    monkeypatch.setattr(ledger_sql.SqlLedger, "_now", lambda self, cur: clock[0])
    return clock


def _as_schema_3_left_it(ledger: SqlLedger) -> None:
    """Forget every period's end, as accounts written before schema 4 have none."""
    with ledger.transaction() as cur:
        ledger._execute(cur, "UPDATE sentdp_accounts SET period_ends = NULL")


def _admitted(
    ledger: SqlLedger, policy: Policy, request: str, charge: Charge | None = None
) -> bool:
    try:
        charge = charge or Charge("deepcandidate", 5 * MICRO, 1)
        ledger.reserve("acme", "u", charge, policy, request)
    except BudgetExhaustedError:
        return False
    return True


def test_changing_the_period_length_renews_nobody_early(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """B = 10 and two releases of 5 fill it. Lengthening or shortening ``period_days``, back
    and forth, must not open a new period before the current one's end: the end of the
    window it opened in (a hostile review spent 20 against B = 10 in one second this way)."""
    ledger = open_ledger(*ledger_url)
    start = 3_000 * WEEK + 2 * DAY  # two days into a 7-day window
    clock = _clocked(monkeypatch, start)
    weekly, fortnightly = (Policy(1, 10 * MICRO, period_seconds=d * DAY) for d in (7, 14))
    assert _admitted(ledger, weekly, "a")
    assert _admitted(ledger, weekly, "b")
    for n, policy in enumerate([weekly, fortnightly, weekly, fortnightly, weekly]):
        assert not _admitted(ledger, policy, f"c{n}"), n
        assert ledger.account("acme", "u", policy).period == 0
    assert ledger.account("acme", "u").period == 0
    clock[0] = 3_001 * WEEK - 1  # the last second of the window the period opened in
    assert not _admitted(ledger, fortnightly, "d")
    clock[0] = 3_001 * WEEK  # it has ended: the next period opens, under 14 days now
    assert ledger.account("acme", "u", fortnightly).period == 1  # /budget sees it coming
    assert ledger.account("acme", "u").period == 0  # ... without writing it
    assert _admitted(ledger, fortnightly, "e")
    assert ledger.account("acme", "u").period == 1
    # It runs to the end of its 14-day window; going back to 7 days does not cut it short.
    fortnight_end = (3_001 * WEEK // (14 * DAY) + 1) * 14 * DAY
    assert _admitted(ledger, fortnightly, "f")
    clock[0] = fortnight_end - 1
    assert not _admitted(ledger, weekly, "g")
    assert ledger.account("acme", "u", weekly).period == 1
    clock[0] = fortnight_end
    assert _admitted(ledger, weekly, "h")
    assert ledger.account("acme", "u").period == 2
    ledger.close()


def test_periods_opened_before_their_end_was_kept_and_by_older_replicas_renew_once(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An account whose period has no recorded end (schema 3, or an older sentdp that only
    writes ``period_window``) is read by its window under today's length: one that opened
    in the current window keeps its spend (and gains its end), one from an earlier window
    renews, once, however many requests race for it."""
    ledger = open_ledger(*ledger_url)
    weekly = Policy(1, 10 * MICRO, period_seconds=WEEK)
    clock = _clocked(monkeypatch, 3_000 * WEEK + DAY)
    assert _admitted(ledger, weekly, "a")
    assert _admitted(ledger, weekly, "b")

    def as_an_older_sentdp_left_it(window: int, spent: bool) -> None:
        with ledger.transaction() as cur:
            ledger._execute(
                cur,
                "UPDATE sentdp_accounts SET period_ends = NULL, period_window = :w"
                + ("" if spent else ", spent_micro = 0, spend_units = 0, documents = 0")
                + " WHERE tenant = 'acme' AND user_id = 'u'",
                {"w": window},
            )

    as_an_older_sentdp_left_it(3_000, spent=True)  # this window: still full
    assert not _admitted(ledger, weekly, "c")
    assert ledger.account("acme", "u", weekly).period == 0
    # An older replica renewed at the start of the next window (period_ends left behind);
    # this sentdp must not renew it a second time.
    clock[0] = 3_001 * WEEK + 10
    with ledger.transaction() as cur:
        ledger._execute(cur, "UPDATE sentdp_accounts SET period = period + 1")
    as_an_older_sentdp_left_it(3_001, spent=False)
    with ledger.transaction() as cur:
        ledger._execute(cur, "UPDATE sentdp_accounts SET period_ends = :e", {"e": 3_001 * WEEK})
    assert _admitted(ledger, weekly, "d")
    assert _admitted(ledger, weekly, "e")
    assert not _admitted(ledger, weekly, "f")  # no second renewal: B spent once this window
    assert ledger.account("acme", "u").period == 1
    # A schema-3 account from an earlier window renews once.
    as_an_older_sentdp_left_it(2_999, spent=True)
    assert _admitted(ledger, weekly, "g")
    assert ledger.account("acme", "u").period == 2
    ledger.close()


def test_a_renewal_racing_a_debit_waits_for_it_so_a_refund_credits_the_right_period(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per document, at a period's end: R1 (its clock one second before the end) has read
    the account when R2 (at the end) renews it. R2 must wait for R1's commit. Otherwise R1
    debits the old period's document row but records its charge in the new period, and its
    refund credits the new period: a hostile review then released 15 of document X against
    B = 10 on PostgreSQL. (SQLite's BEGIN IMMEDIATE serialises the two outright.)"""
    from service.ledger import spend

    ledger = open_ledger(*ledger_url)
    clock = threading.local()
    monkeypatch.setattr(ledger_sql.SqlLedger, "_now", lambda self, cur: clock.now)
    policy = Policy(1, 10 * MICRO, composition=PER_DOCUMENT, period_seconds=WEEK)

    def x(releases: int = 1) -> Charge:
        return Charge("deepcandidate", 5 * MICRO, releases, ("X",) * releases)

    clock.now = 3_000 * WEEK + DAY
    ledger.reserve("acme", "u", x(), policy, "a")
    debit, renewal = spend.debit, []

    def debit_while_a_renewal_starts(*args):  # type: ignore[no-untyped-def]
        if not renewal:

            def renew() -> None:
                clock.now = 3_001 * WEEK
                ledger.reserve("acme", "u", x(2), policy, "r2")

            renewal.append(threading.Thread(target=renew))
            renewal[0].start()
            renewal[0].join(0.5)  # it may not get past R1's read of the account
            renewal.append(renewal[0].is_alive())
        return debit(*args)

    monkeypatch.setattr(spend, "debit", debit_while_a_renewal_starts)
    clock.now = 3_001 * WEEK - 1
    r1 = ledger.reserve("acme", "u", x(), policy, "r1")
    renewal[0].join()
    assert renewal[1] or ledger_url[0].startswith("sqlite")
    periods = {c["request_id"]: c["period"] for c in ledger.charges()}
    assert (periods["r1"], periods["r2"]) == (0, 1)
    ledger.settle("acme", "u", [], r1.charge_ids)  # R1 drew nothing: refunded
    clock.now = 3_001 * WEEK + 5
    assert not _admitted(ledger, policy, "r3", x())  # period 1 holds X's two releases of 5
    ledger.close()


def test_periods_from_before_schema_4_get_their_end_at_start_up_and_keep_it(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A period that opened before its end was kept has only its window's index, in units of
    the period length of the time. The gateway records its end at start-up, under the length
    then; changing the length afterwards renews it no earlier than that end."""
    ledger = open_ledger(*ledger_url)
    weekly, fortnightly = (Policy(1, 10 * MICRO, period_seconds=d * DAY) for d in (7, 14))
    clock = _clocked(monkeypatch, 3_000 * WEEK + DAY)
    assert _admitted(ledger, weekly, "a")
    assert _admitted(ledger, weekly, "b")
    _as_schema_3_left_it(ledger)
    assert ledger.record_period_ends("acme", weekly, clock[0]) == 1
    assert ledger.record_period_ends("acme", weekly, clock[0]) == 0  # once
    assert ledger.record_period_ends("other", weekly, clock[0]) == 0
    assert ledger.record_period_ends("acme", Policy(1, 10 * MICRO), clock[0]) == 0  # no clock
    clock[0] = 3_000 * WEEK + 3 * DAY
    assert not _admitted(ledger, fortnightly, "c")  # without the end: renewed here
    assert not _admitted(ledger, weekly, "d")
    clock[0] = 3_001 * WEEK
    assert _admitted(ledger, fortnightly, "e")
    assert ledger.account("acme", "u").period == 1
    ledger.close()


def test_a_period_from_another_length_gets_no_end_and_renews_as_before(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window index written under a length the tenant no longer has (changed under schema
    3) says nothing about when its period ends: start-up leaves it alone, and the next
    request renews it as schema 3 did, instead of an end in the year 3677 freezing it."""
    ledger = open_ledger(*ledger_url)
    daily, monthly = (Policy(1, 10 * MICRO, period_seconds=d * DAY) for d in (1, 30))
    clock = _clocked(monkeypatch, 20_000 * DAY + 3_600)
    assert _admitted(ledger, daily, "a")
    assert _admitted(ledger, daily, "b")
    _as_schema_3_left_it(ledger)
    assert ledger.record_period_ends("acme", monthly, clock[0]) == 0
    assert _admitted(ledger, monthly, "c")
    assert ledger.account("acme", "u").period == 1
    ledger.close()


def test_a_refund_and_a_reservation_of_the_same_document_do_not_deadlock(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refund that has credited a document row, while a reservation of the same user and
    document starts: both must lock the account before the document, or PostgreSQL aborts
    one of them as a deadlock (a reviewer saw the reservation fail with 503, and then the
    refund lost, its charge left reserved and its key pending)."""
    refunding, reserving = open_ledger(*ledger_url), open_ledger(*ledger_url)
    policy = Policy(1, 10 * MICRO, composition=PER_DOCUMENT)
    charge = Charge("deepcandidate", MICRO, 1, ("d1",))
    first = refunding.reserve("acme", "u", charge, policy, "r0")
    assert isinstance(first, Reservation)
    execute = SqlLedger._execute

    def slow_after_the_document(self, cur, sql, params=None):  # type: ignore[no-untyped-def]
        out = execute(self, cur, sql, params)
        if self is refunding and sql.startswith("UPDATE sentdp_documents"):
            time.sleep(1.0)  # the reservation starts meanwhile
        return out

    monkeypatch.setattr(SqlLedger, "_execute", slow_after_the_document)
    outcome: dict[str, object] = {}

    def run(name: str, call) -> None:  # type: ignore[no-untyped-def]
        try:
            outcome[name] = call()
        except Exception as error:
            outcome[name] = error

    threads = [
        threading.Thread(
            target=run, args=("settle", lambda: refunding.settle("acme", "u", [], first.charge_ids))
        ),
        threading.Thread(
            target=run,
            args=(
                "reserve",
                lambda: (time.sleep(0.3), reserving.reserve("acme", "u", charge, policy, "r1")),
            ),
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not isinstance(outcome["settle"], Exception), outcome["settle"]
    assert not isinstance(outcome["reserve"], Exception), outcome["reserve"]
    assert [c["state"] for c in refunding.charges()] == ["refunded", "reserved"]
    assert refunding.account("acme", "u").spend_units == MICRO
    refunding.close()
    reserving.close()


def _as_a_replica_before_schema_3_debits(ledger: SqlLedger, user: str, micro: int) -> None:
    """What sentdp before schema 3 ran to admit a release: its account row without
    ``spend_units`` or an accountant, its admission on ``spent_micro`` alone, its charge row
    without units (its statements, as they were)."""
    with ledger.transaction() as cur:
        ledger._execute(
            cur,
            "INSERT INTO sentdp_accounts (tenant, user_id) VALUES (:t, :u) "
            "ON CONFLICT (tenant, user_id) DO NOTHING",
            {"t": "acme", "u": user},
        )
        row = ledger._execute(
            cur,
            "UPDATE sentdp_accounts SET spent_micro = spent_micro + :total, "
            "documents = documents + 1 WHERE tenant = :t AND user_id = :u "
            "AND (spent_micro + :total) <= :lim RETURNING period",
            {"t": "acme", "u": user, "total": micro, "lim": 10 * MICRO},
        ).fetchone()
        assert row is not None, "the older replica refused: the test's budget is wrong"
        ledger._execute(
            cur,
            "INSERT INTO sentdp_charges (tenant, user_id, period, micro, state, request_id, "
            "created_at) VALUES (:t, :u, :p, :m, 'reserved', 'old', 0)",
            {"t": "acme", "u": user, "p": row[0], "m": micro},
        )


@pytest.mark.parametrize("first", ["this sentdp", "the older replica"])
def test_an_older_replicas_debits_count_before_this_sentdp_admits(
    ledger_url: tuple[str, str], first: str
) -> None:
    """A replica from before schema 3 beside this one (a rolling upgrade) debits
    ``spent_micro`` only: this sentdp still admits no more than B in all, whoever wrote the
    account first, and /budget shows the older replica's spend."""
    ledger = open_ledger(*ledger_url)
    pure = Policy(1, 10 * MICRO)
    one = Charge("deepcandidate", MICRO, 1)
    if first == "this sentdp":
        ledger.reserve("acme", "u", one, pure, "n0")
        _as_a_replica_before_schema_3_debits(ledger, "u", 6 * MICRO)
    else:
        _as_a_replica_before_schema_3_debits(ledger, "u", 7 * MICRO)
    assert ledger.account("acme", "u", pure).spend_units == 7 * MICRO
    admitted = 0
    while admitted < 20:
        try:
            ledger.reserve("acme", "u", one, pure, f"n{admitted + 1}")
        except BudgetExhaustedError:
            break
        admitted += 1
    assert admitted == 3
    account = ledger.account("acme", "u")
    assert (account.spent_micro, account.spend_units) == (10 * MICRO, 10 * MICRO)
    assert account.accountant == "pure-sequential"
    ledger.close()


def test_an_account_only_an_older_replica_kept_is_not_read_as_rho(
    ledger_url: tuple[str, str],
) -> None:
    """Spend from before schema 3 is pure epsilon, though no accountant is recorded for it: a
    tenant now on zCDP gets 409 for that user until a new period, never its micro-epsilon
    read as micro-rho (epsilon 10 spent would count as rho 10, not 12.5)."""
    from service.ledger import AccountantChangedError

    ledger = open_ledger(*ledger_url)
    _as_a_replica_before_schema_3_debits(ledger, "v", 10 * MICRO)
    with ledger.transaction() as cur:  # as the schema-3 upgrade fills it in
        ledger._execute(cur, "UPDATE sentdp_accounts SET spend_units = spent_micro")
    rho = Policy(1, 40 * MICRO, "zcdp")
    assert ledger.account("acme", "v", rho).accountant == "pure-sequential"
    with pytest.raises(AccountantChangedError, match="pure-sequential"):
        ledger.reserve("acme", "v", Charge("deepcandidate", MICRO, 1), rho, "r1")
    ledger.new_period("acme", "v")
    ledger.reserve("acme", "v", Charge("deepcandidate", MICRO, 1), rho, "r2")
    assert ledger.account("acme", "v").accountant == "zcdp-sequential"
    ledger.close()


@pytest.mark.postgres
def test_an_older_replicas_debit_committing_meanwhile_still_counts(
    ledger_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL, an older replica's debit that starts after this sentdp's reservation has
    made sure of the account row, and commits while the reservation waits for the row, still
    counts: the reservation raises the spend only once it holds the row's lock (a hostile
    review had spent 11 against B = 10 when the raise ran first: its UPDATE's snapshot saw
    nothing to raise). SQLite runs one writer at a time, so this cannot interleave there."""
    url, schema = ledger_url
    if not url.startswith("postgres"):
        pytest.skip("PostgreSQL only: SQLite serialises the two transactions")
    ledger, older = open_ledger(url, schema), open_ledger(url, schema)
    pure = Policy(1, 10 * MICRO)
    one = Charge("deepcandidate", MICRO, 1)
    for n in range(9):
        ledger.reserve("acme", "w", one, pure, f"n{n}")
    inserted, resume = threading.Event(), threading.Event()
    execute = ledger._execute

    def pausing(cur, sql, params=None):  # type: ignore[no-untyped-def]
        result = execute(cur, sql, params)
        if sql.startswith("INSERT INTO sentdp_accounts") and not inserted.is_set():
            inserted.set()
            resume.wait(30)
        return result

    monkeypatch.setattr(ledger, "_execute", pausing)
    outcome: list[object] = []

    def reserve_meanwhile() -> None:
        try:
            outcome.append(ledger.reserve("acme", "w", one, pure, "meanwhile"))
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=reserve_meanwhile)
    thread.start()
    assert inserted.wait(30)
    with older.transaction() as cur:
        older._execute(
            cur,
            "UPDATE sentdp_accounts SET spent_micro = spent_micro + :m, documents = documents + 1 "
            "WHERE tenant = 'acme' AND user_id = 'w'",
            {"m": MICRO},
        )
        resume.set()
        time.sleep(0.5)  # the reservation goes on, and waits for the older replica's row
    thread.join(30)
    assert len(outcome) == 1
    assert isinstance(outcome[0], BudgetExhaustedError), outcome
    account = ledger.account("acme", "w")
    assert (account.spent_micro, account.spend_units) == (10 * MICRO, 10 * MICRO)
    ledger.close()
    older.close()


def test_an_account_an_older_replica_created_without_spend_is_served(
    ledger_url: tuple[str, str],
) -> None:
    """An older replica's account row has no spend_units (NULL); with nothing spent, every
    accountant still admits its requests (a NULL spend made every admission NULL: 402 with
    nothing spent)."""
    ledger = open_ledger(*ledger_url)
    with ledger.transaction() as cur:
        for user in ("p", "d"):
            ledger._execute(
                cur,
                "INSERT INTO sentdp_accounts (tenant, user_id) VALUES ('acme', :u)",
                {"u": user},
            )
    ledger.reserve("acme", "p", Charge("deepcandidate", MICRO, 1), Policy(1, 10 * MICRO), "r1")
    per_document = Policy(1, 10 * MICRO, composition=PER_DOCUMENT)
    ledger.reserve("acme", "d", Charge("deepcandidate", MICRO, 1, ("x",)), per_document, "r2")
    assert ledger.account("acme", "p").spend_units == MICRO
    assert ledger.account("acme", "d").spend_units == MICRO
    ledger.close()
