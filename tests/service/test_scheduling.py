"""The worker's gate (one computation at a time, keys served round-robin) and compute thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from service.scheduling import ComputeThread, FairExecutor, FairGate, TenantLoad, Turn
from tests.support import Concurrency, wait_for


def test_a_flooding_key_does_not_starve_another() -> None:
    gate = FairGate()
    order: list[str] = []
    release = threading.Event()

    def work(key: str, label: str) -> None:
        with gate.turn(key):
            order.append(label)
            if label == "A0":
                release.wait(5)

    first = threading.Thread(target=work, args=("A", "A0"))
    first.start()
    wait_for(lambda: order == ["A0"])
    threads = []
    labels = [("A1", "A"), ("A2", "A"), ("A3", "A"), ("B1", "B"), ("B2", "B")]
    for n, (label, key) in enumerate(labels, start=1):
        thread = threading.Thread(target=work, args=(key, label))
        thread.start()
        threads.append(thread)
        wait_for(lambda n=n: gate.waiting() == n)  # arrival order: A1, A2, A3, B1, B2
    assert gate.waiting() == 5
    release.set()
    for thread in [first, *threads]:
        thread.join(5)
    assert order == ["A0", "B1", "A1", "B2", "A2", "A3"]


def test_only_one_computation_runs_at_a_time() -> None:
    gate = FairGate()
    running = []
    peak = []

    def work(key: int) -> None:
        with gate.turn(key % 3):
            running.append(key)
            peak.append(len(running))
            time.sleep(0.002)
            running.remove(key)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert max(peak) == 1
    assert len(peak) == 30


def test_a_waiter_gives_up_at_its_deadline_and_the_next_one_goes() -> None:
    gate = FairGate()
    release = threading.Event()
    outcomes: dict[str, bool] = {}

    def hold() -> None:
        with gate.turn("A") as turn:
            outcomes["A"] = turn.granted
            release.wait(5)

    def wait(key: str, deadline: float | None) -> None:
        with gate.turn(key, deadline) as turn:
            outcomes[key] = turn.granted

    holder = threading.Thread(target=hold)
    holder.start()
    wait_for(lambda: "A" in outcomes)
    late = threading.Thread(target=wait, args=("B", time.time() + 0.1))
    patient = threading.Thread(target=wait, args=("C", None))
    late.start()
    time.sleep(0.02)
    patient.start()
    late.join(5)
    assert outcomes == {"A": True, "B": False}  # B gave up while A still held the gate
    release.set()
    holder.join(5)
    patient.join(5)
    assert outcomes == {"A": True, "B": False, "C": True}
    assert gate.waiting() == 0


class Holders:
    """Threads that each hold the gate under a key until released; and late waiters."""

    def __init__(self, gate: FairGate) -> None:
        self.gate = gate
        self.holding: list[str] = []
        self.release: dict[str, threading.Event] = {}
        self.turns: dict[str, Turn] = {}
        self.threads: list[threading.Thread] = []

    def hold(self, name: str, key: str) -> None:
        self.release[name] = threading.Event()

        def body() -> None:
            with self.gate.turn(key) as turn:
                assert turn.granted
                self.holding.append(name)
                self.release[name].wait(10)

        self._start(body, lambda: name in self.holding)

    def wait(self, name: str, key: str, seconds: float) -> None:
        def body() -> None:
            with self.gate.turn(key, time.time() + seconds) as turn:
                self.turns[name] = turn

        self._start(body, lambda: name in self.turns)

    def _start(self, body: Callable[[], None], done: Callable[[], bool]) -> None:
        """Start ``body`` and return once it is queued at the gate (or already through)."""
        waiting = self.gate.waiting()
        thread = threading.Thread(target=body)
        thread.start()
        self.threads.append(thread)
        wait_for(lambda: self.gate.waiting() > waiting or done())

    def finish(self) -> None:
        for event in self.release.values():
            event.set()
        for thread in self.threads:
            thread.join(10)
        assert self.gate.waiting() == 0


def test_a_late_waiter_behind_its_own_key_for_most_of_its_wait_is_told_so() -> None:
    gate = FairGate()
    run = Holders(gate)
    run.hold("A0", "A")
    wait_for(lambda: run.holding == ["A0"])
    run.wait("A-late", "A", 0.3)
    run.wait("B-late", "B", 0.3)
    run.wait("A-past", "A", -1.0)
    wait_for(lambda: len(run.turns) == 3)
    assert run.turns["A-late"] == Turn(False, behind_own=True)  # A held it all along
    assert run.turns["B-late"] == Turn(False, behind_own=False)  # another key's work only
    assert run.turns["A-past"] == Turn(False, behind_own=False)  # late on arrival: no wait
    run.finish()


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        # A1 arrives while A holds the gate; A ends at once and B then holds it past A1's
        # deadline: A1 is late because of B, not of its own key.
        ("A", "B", False),
        # A1 and A's second request wait behind B; B ends at once and A takes the gate and
        # holds it past A1's deadline: A1 is late because of its own key.
        ("B", "A", True),
    ],
)
def test_a_late_waiter_is_blamed_on_whoever_held_the_gate_for_most_of_its_wait(
    first: str, second: str, expected: bool
) -> None:
    gate = FairGate()
    run = Holders(gate)
    run.hold("first", first)
    wait_for(lambda: run.holding == ["first"])
    run.hold("second", second)
    run.wait("A1", "A", 1.0)
    run.release["first"].set()
    wait_for(lambda: run.holding == ["first", "second"])
    wait_for(lambda: "A1" in run.turns)
    assert run.turns["A1"] == Turn(False, behind_own=expected)
    run.finish()


def test_every_call_runs_on_one_thread_whoever_calls() -> None:
    compute = ComputeThread()
    ran_on: list[int] = []

    def call() -> None:
        ran_on.append(compute.run(threading.get_ident))

    callers = [threading.Thread(target=call) for _ in range(6)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    call()
    assert len(ran_on) == 7
    assert len(set(ran_on)) == 1
    assert ran_on[0] not in {threading.get_ident(), *(c.ident for c in callers)}


def test_the_caller_gets_the_result_or_the_exception() -> None:
    compute = ComputeThread()
    assert compute.run(divmod, 7, 2) == (3, 1)

    def fail() -> None:
        raise ValueError("from the compute thread")

    with pytest.raises(ValueError, match="from the compute thread"):
        compute.run(fail)
    assert compute.run(sum, [1, 2]) == 3  # the thread survives a failed call


def test_a_tenants_smallest_requests_still_count_a_64th_of_its_limit() -> None:
    load = TenantLoad(6400)
    assert [load.try_acquire("a", 1) for _ in range(65)] == [True] * 64 + [False]
    assert load.try_acquire("b", 1)  # another tenant's share is its own
    load.release("a", 1)
    assert load.try_acquire("a", 1)
    assert not load.try_acquire("a", 1)
    # large requests weigh what they cost, and a small limit keeps its plain arithmetic
    large = TenantLoad(6400)
    assert large.try_acquire("a", 6000)
    assert not large.try_acquire("a", 401)
    assert large.try_acquire("a", 400)
    small = TenantLoad(24)
    assert (small.try_acquire("a", 20), small.try_acquire("a", 4)) == (True, True)
    few = TenantLoad(6400, requests=2)  # the operator's own cap on requests
    assert [few.try_acquire("a", 1) for _ in range(3)] == [True, True, False]


def test_the_fair_executor_serves_keys_in_turns_and_each_key_in_order() -> None:
    """One thread, busy with A's first call while A queues five more and B one: B runs
    after at most one more of A's (a first-come executor would run it last), A's run in
    the order sent, and B's and C's backlogs interleave with A's."""
    fair = FairExecutor(1, "test-fair")
    started = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def blocker() -> None:
        started.set()
        release.wait(10)
        order.append("A0")

    futures = [fair.submit("A", blocker)]
    started.wait(5)
    futures += [fair.submit("A", order.append, f"A{n}") for n in range(1, 6)]
    futures += [fair.submit("B", order.append, "B1"), fair.submit("B", order.append, "B2")]
    futures.append(fair.for_key("C").submit(order.append, "C1"))
    assert fair.waiting() == 8
    release.set()
    for future in futures:
        future.result(5)
    assert order == ["A0", "A1", "B1", "C1", "A2", "B2", "A3", "A4", "A5"]
    assert fair.waiting() == 0


def test_the_fair_executor_hands_back_errors_and_skips_cancelled_calls() -> None:
    fair = FairExecutor(1, "test-fair")
    release = threading.Event()
    ran: list[str] = []
    busy = fair.submit("A", release.wait, 10)
    skipped = fair.submit("B", ran.append, "cancelled")
    assert skipped.cancel()  # not started: it never runs
    failing = fair.submit("A", int, "not a number")
    keyword = fair.for_key("C").submit(sorted, [3, 1, 2], reverse=True)
    release.set()
    assert busy.result(5) is True
    with pytest.raises(ValueError, match="invalid literal"):
        failing.result(5)
    assert keyword.result(5) == [3, 2, 1]
    assert ran == []
    with pytest.raises(ValueError, match="threads >= 1"):
        FairExecutor(0, "none")


def test_a_key_holds_at_most_its_share_of_the_threads() -> None:
    """Four threads, two per key: A's backlog runs two at a time and B's call gets a free
    thread at once, even while A has calls waiting; every call runs exactly once."""
    fair = FairExecutor(4, "test-fair", per_key=2)
    probe = Concurrency()
    running, most = probe.running, probe.most
    done: list[str] = []
    release = threading.Event()

    def call(key: str, label: str) -> None:
        with probe.counting(key):
            release.wait(10)
        done.append(label)

    futures = [fair.submit("A", call, "A", f"A{n}") for n in range(6)]
    wait_for(lambda: running.get("A") == 2)
    b = fair.submit("B", call, "B", "B1")
    wait_for(lambda: running.get("B") == 1)  # a free thread, though A's four still wait
    assert fair.waiting() == 4
    release.set()
    for future in [*futures, b]:
        future.result(10)
    assert most == {"A": 2, "B": 1}
    assert sorted(done) == sorted([f"A{n}" for n in range(6)] + ["B1"])
    assert fair.waiting() == 0


def test_the_fair_executor_survives_base_exceptions_and_keeps_the_callers_context() -> None:
    import contextvars

    fair = FairExecutor(1, "test-fair")
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")

    def stop() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        fair.submit("A", stop).result(5)
    assert fair.submit("A", int, "7").result(5) == 7  # its thread still serves
    tenant.set("acme")
    seen = fair.submit("A", contextvars.copy_context().run, tenant.get).result(5)
    assert seen == "acme"


def test_shutting_down_runs_every_queued_call_even_those_deferred() -> None:
    """A's calls beyond its one thread are deferred; a shutdown that starts meanwhile still
    runs them once A's running call ends (the pool then takes no new tasks)."""
    fair = FairExecutor(2, "test-fair", per_key=1)
    release = threading.Event()
    ran: list[str] = []
    fair.submit("A", release.wait, 10)
    wait_for(lambda: fair.waiting() == 0)
    for n in range(3):
        fair.submit("A", ran.append, f"A{n}")
    fair.submit("B", ran.append, "B0")
    wait_for(lambda: ran == ["B0"] and fair._deferred == 3)
    stopping = threading.Thread(target=fair.shutdown)
    stopping.start()
    release.set()
    stopping.join(10)
    assert not stopping.is_alive()
    assert ran == ["B0", "A0", "A1", "A2"]


def stress_trial(trial: int) -> None:
    """One random trial of :func:`test_the_fair_executor_runs_every_call_once_under_random_load`."""
    import random

    rng = random.Random(trial)
    threads = rng.randint(1, 5)
    fair = FairExecutor(threads, f"stress-{trial}", per_key=rng.randint(1, threads))
    keys = [f"k{n}" for n in range(rng.randint(1, 6))]
    lock = threading.Lock()
    ran: list[int] = []
    probe = Concurrency()
    submitted: list[tuple[int, Future[None]]] = []

    def call(key: str, label: int, pause: float) -> None:
        with probe.counting(key):
            time.sleep(pause)
        with lock:
            ran.append(label)

    def submitter(offset: int) -> None:
        local = random.Random(trial * 10 + offset)
        for n in range(25):
            label = offset * 1000 + n
            key = local.choice(keys)
            pause = local.choice((0.0, 0.0, 0.001, 0.003))
            future = fair.submit(key, call, key, label, pause)
            with lock:
                submitted.append((label, future))

    senders = [threading.Thread(target=submitter, args=(n,)) for n in range(3)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    cancelled = {label for label, future in submitted if rng.random() < 0.3 and future.cancel()}
    for label, future in submitted:
        if label not in cancelled:
            future.result(10)
    wait_for(lambda: fair.waiting() == 0 and not fair._running)
    assert sorted(ran) == sorted(label for label, _ in submitted if label not in cancelled)
    assert max(probe.most.values(), default=0) <= fair.per_key
    fair.shutdown()


def test_the_fair_executor_runs_every_call_once_under_random_load() -> None:
    """Random threads, per-key limits, keys, cancellations and durations, with calls
    submitted from three threads: every call not cancelled runs exactly once, no cancelled
    one runs, no key passes its limit, and nothing is left."""
    for trial in range(60):
        stress_trial(trial)


def test_a_shut_down_executor_refuses_calls_and_drains_a_long_deferred_backlog() -> None:
    """3,000 calls deferred behind one running call of their key all run once the shutdown
    has begun (on the thread that ends, without recursing), and a call submitted after the
    shutdown is refused without taking another call's place."""
    fair = FairExecutor(2, "test-fair", per_key=1)
    release = threading.Event()
    ran: list[int] = []
    fair.submit("A", release.wait, 10)
    wait_for(lambda: fair.waiting() == 0)
    futures = [fair.submit("A", ran.append, n) for n in range(3000)]
    wait_for(lambda: fair._deferred == 3000)
    stopping = threading.Thread(target=fair.shutdown)
    stopping.start()
    wait_for(lambda: fair._closed)
    with pytest.raises(RuntimeError, match="after shutdown"):
        fair.submit("B", ran.append, -1)
    release.set()
    stopping.join(30)
    assert not stopping.is_alive()
    assert ran == list(range(3000))
    assert all(future.done() for future in futures)
