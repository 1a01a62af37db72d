"""The worker's gate (one computation at a time, keys served round-robin) and compute thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from service.scheduling import ComputeThread, FairGate, Turn


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll until ``condition`` holds (ordering by state, not by sleeps a loaded CI can overrun)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.001)


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


def test_a_late_waiter_learns_whether_its_own_key_held_the_gate() -> None:
    """Late behind its own key's work (held on arrival, or granted while it waited): its own
    backlog; late behind other keys' work only: not."""
    gate = FairGate()
    turns: dict[str, object] = {}
    release = {name: threading.Event() for name in ("A0", "B0", "A1")}
    holding: list[str] = []

    def hold(name: str, key: str) -> None:
        with gate.turn(key) as turn:
            assert turn.granted
            holding.append(name)
            release[name].wait(5)

    def wait(name: str, key: str, seconds: float) -> None:
        with gate.turn(key, time.time() + seconds) as turn:
            turns[name] = turn

    first = threading.Thread(target=hold, args=("A0", "A"))
    first.start()
    wait_for(lambda: holding == ["A0"])
    behind_a = threading.Thread(target=wait, args=("a-late", "A", 0.2))
    behind_a_for_b = threading.Thread(target=wait, args=("b-late", "B", 0.2))
    behind_a.start()
    behind_a_for_b.start()
    behind_a.join(5)
    behind_a_for_b.join(5)
    assert turns["a-late"] == Turn(False, behind_own=True)  # A held the gate on arrival
    assert turns["b-late"] == Turn(False, behind_own=False)  # only another key's work
    # C arrives while A holds; B then A1 are served before C's deadline passes.
    second_b = threading.Thread(target=hold, args=("B0", "B"))
    second_b.start()
    wait_for(lambda: gate.waiting() == 1)
    c_late = threading.Thread(target=wait, args=("c-late", "C", 0.5))
    c_late.start()
    wait_for(lambda: gate.waiting() == 2)
    release["A0"].set()
    wait_for(lambda: holding == ["A0", "B0"])
    c_late.join(5)
    assert turns["c-late"] == Turn(False, behind_own=False)
    release["B0"].set()
    first.join(5)
    second_b.join(5)
    # D waits while the gate is free of D's key, and D's own earlier request is granted first.
    third = threading.Thread(target=hold, args=("A1", "A"))
    third.start()
    wait_for(lambda: holding[-1] == "A1")
    d_first = threading.Thread(target=hold, args=("D0", "D"))
    release["D0"] = threading.Event()
    d_first.start()
    wait_for(lambda: gate.waiting() == 1)
    d_late = threading.Thread(target=wait, args=("d-late", "D", 0.5))
    d_late.start()
    wait_for(lambda: gate.waiting() == 2)
    release["A1"].set()
    wait_for(lambda: holding[-1] == "D0")  # D's first request took the gate from A
    d_late.join(5)
    assert turns["d-late"] == Turn(False, behind_own=True)
    release["D0"].set()
    third.join(5)
    d_first.join(5)
    assert gate.waiting() == 0


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
