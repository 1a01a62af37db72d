"""The worker's checks of the length buckets its start-up probes miss (service.worker with
service.invariance.LaterChecks): checked after start-up, all of them before any batch is
encoded whatever it holds, and a failure that either finds a mode afresh or closes the
worker."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from service.invariance import LaterChecks, NoInvariantModeError, StartUpCheck
from service.logs import JsonFormatter
from service.scheduling import ComputeThread, FairGate
from service.schemas import CLOSED_ERROR, LATE_ERROR, WorkItem, WorkRequest, WorkResult
from service.worker import CLOSED_MARKER, LATER_KEY, Worker, check_limit, closed_marker
from tests.sentdp.fake_encoders import CHAR_BUCKETS, FixedPasses, in_bucket

DEFAULT = [8, 16, 64, 256]  # the fake's buckets the invariance probes reach
LATER = [32, 128, 512]
SECRET = "secret words"
"""In an error's message (as a row's text could be): never in the log."""


class Slow(FixedPasses):
    """An encoder that takes ``pause`` seconds more for every call."""

    def __init__(self, rows: int, pause: float = 0.01) -> None:
        super().__init__(rows)
        self.pause = pause

    def encode(self, sentences):  # type: ignore[no-untyped-def]
        time.sleep(self.pause)
        return super().encode(sentences)


def as_logged(caplog: pytest.LogCaptureFixture) -> str:
    """The captured records as the service's JSON log writes them (messages redacted)."""
    formatter = JsonFormatter()
    return "\n".join(formatter.format(record) for record in caplog.records)


def worker(encoder: Any, remode: Any = None) -> SimpleNamespace:
    """The worker's state and bucket-checking methods around ``encoder``; ``remode`` stands
    for choosing the mode again (every bucket checked, the failed encoder rejected)."""
    ns = SimpleNamespace(encoder=encoder, encoder_mode="cpu", closed=False, remodes=[])
    ns.closed_marker, ns.fault_marker = None, None
    ns.rechoices = 0
    ns._build_mechanisms = lambda: None
    ns.later = LaterChecks(encoder, DEFAULT, "later")

    def choose(every_bucket: bool, rejected: bool = False) -> str:
        ns.remodes.append((every_bucket, rejected))
        if remode is None:
            raise NoInvariantModeError("the encoder's output depends on its batch")
        ns.encoder = remode
        ns.later = LaterChecks(remode, list(CHAR_BUCKETS), "later")
        return "cpu-fixed-batch"

    ns._batch_invariant_encoder = choose
    ns._check_later = lambda through: Worker.inner._check_later(ns, through)
    ns._choose_mode_again = lambda where: Worker.inner._choose_mode_again(ns, where)
    ns._close = lambda **fields: Worker.inner._close(ns, **fields)
    return ns


def request(*lengths: int, deadline: float = 4e9) -> WorkRequest:
    items = [
        WorkItem(charge_id=n, model="m", variant="v", sentences=["a" * k], epsilon=1.0, p=1)
        for n, k in enumerate(lengths)
    ]
    return WorkRequest(request_id="r", tenant="t", deadline=deadline, items=items)


def live(*requests: WorkRequest) -> list[tuple[int, int, WorkItem]]:
    return [(r, i, item) for r, req in enumerate(requests) for i, item in enumerate(req.items)]


def checked(ns: SimpleNamespace, *requests: WorkRequest) -> tuple[list[Any], list[list[Any]]]:
    replies: list[list[Any]] = [[None] * len(r.items) for r in requests]
    return Worker.inner._checked_buckets(ns, list(requests), live(*requests), replies), replies


def test_any_batch_waits_for_every_pending_bucket_whatever_it_holds() -> None:
    """Which checks run before a batch never depends on its sentences: a batch of the
    default buckets' sentences waits for all of them, as one of long sentences does."""
    for lengths in [(5,), (100, 20), (500,)]:
        ns = worker(FixedPasses(8))
        throughs: list[int] = []
        ns._check_later = lambda through: (
            throughs.append(through),  # noqa: B023
            Worker.inner._check_later(ns, through),  # noqa: B023
        )
        batch = request(*lengths)
        assert checked(ns, batch)[0] == live(batch)
        assert (throughs, ns.later.pending(), ns.later.checked) == (LATER, [], LATER)


def test_a_fault_found_before_a_batch_chooses_the_mode_again_and_the_batch_encodes_with_it() -> (
    None
):
    fixed = FixedPasses(8)
    ns = worker(FixedPasses(8, in_bucket(128), fixed=False), remode=fixed)
    batch = request(5)
    assert checked(ns, batch)[0] == live(batch)
    assert ns.remodes == [(True, True)]
    assert (ns.encoder, ns.encoder_mode, ns.closed) == (fixed, "cpu-fixed-batch", False)
    assert ns.later.pending() == []


def test_when_no_mode_passes_the_worker_refuses_every_item_and_is_not_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = worker(FixedPasses(8, in_bucket(32), fixed=False))
    batch = request(20, 5)
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        encode, replies = checked(ns, batch)
    assert (encode, ns.closed) == ([], True)
    assert replies == [[WorkResult(sampled=False, error=CLOSED_ERROR)] * 2]
    assert Worker.inner.__is_ready__(ns) is False
    events = {r.sentdp_fields["event"]: r for r in caplog.records if hasattr(r, "sentdp_fields")}
    assert events["encoder_bucket_moved"].levelno == logging.WARNING
    assert events["encoder_bucket_moved"].sentdp_fields["where"].startswith("bucket 32: probe ")
    refusing = events["worker_refusing_to_serve"]
    assert (refusing.levelno, refusing.sentdp_fields["error"]) == (
        logging.ERROR,
        "NoInvariantModeError",
    )
    assert "depends on its batch" not in str(refusing.sentdp_fields)
    assert "encoder_bucket_check_failed" not in events  # no mode passing is not retried
    again = request(5)
    assert checked(ns, again) == ([], [[WorkResult(sampled=False, error=CLOSED_ERROR)]])
    assert ns.remodes == [(True, True)]  # tried once, and no check runs again once closed


def test_a_request_that_waited_too_long_for_the_checks_draws_nothing() -> None:
    """Past its start deadline (it started in time, then waited for the checks) a request
    is still encoded, until half the batching goal later: then it draws nothing."""

    ns = worker(Slow(8))
    limit = check_limit(request(5, deadline=0.0))  # how far past its start deadline
    assert limit >= 10
    soon = request(5, deadline=time.time() - limit + 0.05)
    started_late = request(5, deadline=time.time() - 1)
    encode, replies = checked(ns, soon, started_late)
    assert encode == live(soon, started_late)[1:]
    assert replies[0] == [WorkResult(sampled=False, error=LATE_ERROR)]


def test_a_new_mode_that_leaves_buckets_pending_has_them_checked_too() -> None:
    """After a mode is chosen again the batch waits for whatever that mode left pending."""
    ns = worker(FixedPasses(8, in_bucket(128), fixed=False))
    fresh = FixedPasses(8)

    def choose(every_bucket: bool, rejected: bool = False) -> str:
        ns.encoder, ns.later = fresh, LaterChecks(fresh, DEFAULT, "later")
        return "cpu-fixed-batch"

    ns._batch_invariant_encoder = choose
    batch = request(5)
    assert checked(ns, batch)[0] == live(batch)
    assert (ns.later.checked, ns.closed) == (LATER, False)


def test_the_real_mode_choice_after_a_fault_rejects_the_encoder_and_checks_every_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's own re-choice: the failed encoder rejected, every bucket checked (logged
    as later), the device the worker was asked for, and its mechanisms built again."""
    import service.worker as module

    calls: list[tuple[StartUpCheck, bool, str]] = []
    fresh = FixedPasses(8)

    def choose(encoder, reopen, check, graphs, deterministic, rejected, device):  # type: ignore[no-untyped-def]
        calls.append((check, rejected, device))
        assert check(fresh) == []
        return fresh, "cpu-fixed-batch"

    monkeypatch.setattr(module, "invariant_encoder", choose)
    ns = SimpleNamespace(encoder=FixedPasses(8, in_bucket(128), fixed=False), closed=False)
    ns.closed_marker, ns.fault_marker = None, None
    ns.encoder_mode, ns._reopen, ns.device, ns.built, ns.rechoices = "cpu", None, "cuda:0", 0, 0
    ns._batch_invariant_encoder = lambda every_bucket, rejected=False: (
        Worker.inner._batch_invariant_encoder(ns, every_bucket, rejected)
    )
    ns._check_later = lambda through: Worker.inner._check_later(ns, through)
    ns._choose_mode_again = lambda where: Worker.inner._choose_mode_again(ns, where)
    ns._close = lambda **fields: Worker.inner._close(ns, **fields)
    ns._build_mechanisms = lambda: setattr(ns, "built", ns.built + 1)
    ns.later = LaterChecks(ns.encoder, DEFAULT, "later")
    batch = request(5)
    assert checked(ns, batch)[0] == live(batch)
    ((check, rejected, device),) = calls
    assert (check.every_bucket, check.when, rejected, device) == (
        True,
        "later",
        True,
        "cuda:0",
    )
    assert (ns.encoder, ns.encoder_mode, ns.later.pending(), ns.built) == (
        fresh,
        "cpu-fixed-batch",
        [],
        1,
    )


class Raises(FixedPasses):
    """Raises ``errors`` in turn on the first calls that hold a row of over 20 characters
    (one in a bucket the start-up probes miss), then encodes."""

    def __init__(self, rows: int, *errors: type[Exception]) -> None:
        super().__init__(rows)
        self.errors, self.raised = errors, 0

    def encode(self, sentences):  # type: ignore[no-untyped-def]
        if self.raised < len(self.errors) and any(len(s) > 20 for s in sentences):
            self.raised += 1
            raise self.errors[self.raised - 1](f"out of memory at row {SECRET!r}")
        return super().encode(sentences)


@pytest.mark.parametrize("error", [RuntimeError, ValueError, MemoryError])
def test_a_check_that_raises_twice_closes_the_worker(
    error: type[Exception], caplog: pytest.LogCaptureFixture
) -> None:
    encoder = Raises(8, error, KeyError, *[error] * 8)
    ns = worker(encoder, remode=FixedPasses(8))
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        assert checked(ns, request(5)) == ([], [[WorkResult(sampled=False, error=CLOSED_ERROR)]])
    assert ns.closed
    assert encoder.raised == 2  # run once more, then no more
    assert ns.remodes == []  # an error is not a moved probe: no mode is chosen again
    events = [r.sentdp_fields for r in caplog.records if hasattr(r, "sentdp_fields")]
    assert events == [
        {"event": "encoder_bucket_check_failed", "error": error.__name__, "bucket": 32},
        {"event": "worker_refusing_to_serve", "error": "KeyError", "bucket": 32},
    ]
    logged = as_logged(caplog)
    assert SECRET not in logged
    assert logged.count("in encode") == 2  # each with the stack it was raised from
    assert Worker.inner.__is_ready__(ns) is False
    Worker.inner._check_later(ns, 512)  # nothing runs again once closed
    assert encoder.raised == 2


def test_a_closed_worker_leaves_a_marker_that_makes_its_siblings_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With several worker processes the gateway's probe reaches one of them: the one that
    refuses to serve leaves a file in the server's shared metrics folder, and every other
    one then says not ready too (in-process, with no such folder, none is written)."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert closed_marker() == tmp_path / CLOSED_MARKER
    failing = worker(Raises(8, RuntimeError, RuntimeError), remode=FixedPasses(8))
    sibling = worker(FixedPasses(8))
    failing.closed_marker = sibling.closed_marker = closed_marker()
    Worker.inner._check_later(sibling, 512)
    assert Worker.inner.__is_ready__(sibling) is True
    assert checked(failing, request(5))[0] == []
    assert (failing.closed, sibling.closed) == (True, False)
    assert (tmp_path / CLOSED_MARKER).exists()
    assert Worker.inner.__is_ready__(sibling) is False  # it still serves, but is not ready
    assert checked(sibling, request(5))[0] == live(request(5))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    assert closed_marker() is None


def test_a_new_mode_whose_mechanisms_fail_to_build_closes_the_worker_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Choosing a mode again changes the encoder, its checks and the mechanisms in turn: an
    error half-way is never run again (the retry would find nothing pending and serve with
    the old mechanisms)."""
    ns = worker(FixedPasses(8, in_bucket(32), fixed=False), remode=FixedPasses(8))
    builds: list[int] = []

    def build() -> None:
        builds.append(1)
        if len(builds) == 1:
            raise MemoryError("no room for the depth index")

    ns._build_mechanisms = build
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        assert checked(ns, request(5)) == ([], [[WorkResult(sampled=False, error=CLOSED_ERROR)]])
    assert (ns.closed, len(ns.remodes), len(builds)) == (True, 1, 1)
    events = [r.sentdp_fields["event"] for r in caplog.records if hasattr(r, "sentdp_fields")]
    assert "encoder_bucket_check_failed" not in events
    assert events[-1] == "worker_refusing_to_serve"
    assert Worker.inner.__is_ready__(ns) is False


@pytest.mark.parametrize("error", [RuntimeError, ValueError, MemoryError])
def test_a_check_that_raises_once_is_run_again_and_the_worker_serves(
    error: type[Exception], caplog: pytest.LogCaptureFixture
) -> None:
    encoder = Raises(8, error)
    ns = worker(encoder, remode=FixedPasses(8))
    batch = request(5)
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        assert checked(ns, batch) == (live(batch), [[None]])
    assert (encoder.raised, ns.closed, ns.remodes) == (1, False, [])
    assert (ns.later.pending(), ns.later.checked) == ([], LATER)
    assert Worker.inner.__is_ready__(ns) is True
    failed = [
        r
        for r in caplog.records
        if getattr(r, "sentdp_fields", {}).get("event") == ("encoder_bucket_check_failed")
    ]
    assert [(r.levelno, r.sentdp_fields) for r in failed] == [
        (
            logging.WARNING,
            {"event": "encoder_bucket_check_failed", "error": error.__name__, "bucket": 32},
        )
    ]
    assert SECRET not in as_logged(caplog)


def test_a_closed_worker_checks_nothing_more() -> None:
    """The checking thread may still hold a bucket to check when a batch closes the worker."""
    ns = worker(FixedPasses(8))
    ns.closed = True
    Worker.inner._check_later(ns, 512)
    assert (ns.later.pending(), ns.later.checked) == (LATER, [])


def test_requests_late_after_the_checks_are_counted_once_each() -> None:
    from service.metrics import metric

    counter = metric("late_requests")
    before = counter._value.get()
    ns = worker(Slow(8))
    limit = check_limit(request(5, deadline=0.0))
    soon = [request(5, 5, deadline=time.time() - limit + 0.05) for _ in range(2)]
    checked(ns, *soon, request(5))
    assert counter._value.get() - before == 2


class CountingGate(FairGate):
    def __init__(self) -> None:
        super().__init__()
        self.keys: list[object] = []

    def turn(self, key, deadline=None):  # type: ignore[no-untyped-def]
        self.keys.append(key)
        return super().turn(key, deadline)


def test_after_start_up_the_pending_buckets_are_checked_one_per_turn_smallest_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = worker(FixedPasses(8))
    ns.gate, ns.compute = CountingGate(), ComputeThread()
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        Worker.inner._check_buckets(ns)
    assert ns.gate.keys == [LATER_KEY] * 3
    events = [
        r.sentdp_fields
        for r in caplog.records
        if getattr(r, "sentdp_fields", {}).get("event") == "encoder_bucket_checked"
    ]
    assert [(e["bucket"], e["when"]) for e in events] == [(b, "later") for b in LATER]
    assert ns.later.pending() == []


def test_the_checking_thread_runs_a_check_that_raised_once_again_in_the_same_turn() -> None:
    encoder = Raises(8, MemoryError)
    ns = worker(encoder)
    ns.gate, ns.compute = CountingGate(), ComputeThread()
    Worker.inner._check_buckets(ns)
    assert (encoder.raised, ns.closed, ns.later.checked) == (1, False, LATER)
    assert ns.gate.keys == [LATER_KEY] * 3


def test_the_checking_thread_stops_once_the_worker_refuses_to_serve() -> None:
    ns = worker(FixedPasses(8, in_bucket(128), fixed=False))
    ns.gate, ns.compute = CountingGate(), ComputeThread()
    Worker.inner._check_buckets(ns)
    assert ns.closed
    assert ns.gate.keys == [LATER_KEY] * 2  # 32 passed; 128 moved and no mode passed
    assert ns.later.pending() == [128, 512]


def test_every_batch_passes_the_bucket_checks_before_it_is_planned() -> None:
    ns = worker(FixedPasses(8))
    planned: list[list[int]] = []

    def plans(items: list[WorkItem], tenants: list[str]) -> list[Any]:
        planned.append(ns.later.pending())
        return ["stopped before sampling"] * len(items)

    ns._refusal = lambda item: None
    ns._checked_buckets = lambda requests, live, replies: Worker.inner._checked_buckets(
        ns, requests, live, replies
    )
    ns._plans = plans
    ns.trim_memory = lambda sentences: None
    (reply,) = Worker.inner._compute(ns, [request(5)])
    assert planned == [[]]
    assert reply.results == [WorkResult(sampled=False, error="stopped before sampling")]
    ns.closed = True
    (reply,) = Worker.inner._compute(ns, [request(5)])
    assert reply.results == [WorkResult(sampled=False, error=CLOSED_ERROR)]


def test_a_worker_whose_new_modes_keep_failing_stops_trying_and_refuses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = worker(FixedPasses(8, in_bucket(128), fixed=False))

    def choose(every_bucket: bool, rejected: bool = False) -> str:
        ns.remodes.append((every_bucket, rejected))
        ns.encoder = FixedPasses(8, in_bucket(128), fixed=False)
        ns.later = LaterChecks(ns.encoder, DEFAULT, "later")  # left pending: a bug
        return "cpu-fixed-batch"

    ns._batch_invariant_encoder = choose
    with caplog.at_level(logging.ERROR, logger="sentdp.service"):
        assert checked(ns, request(5)) == ([], [[WorkResult(sampled=False, error=CLOSED_ERROR)]])
    assert len(ns.remodes) == 3
    assert ns.closed
    (event,) = [r.sentdp_fields for r in caplog.records if hasattr(r, "sentdp_fields")]
    assert event == {"event": "worker_refusing_to_serve", "error": "NoInvariantModeError"}
    thread = worker(FixedPasses(8, in_bucket(128), fixed=False))  # the checking thread too
    thread._batch_invariant_encoder = choose
    thread.gate, thread.compute = CountingGate(), ComputeThread()
    ns.remodes.clear()
    ns.later, ns.encoder, ns.closed, ns.rechoices = thread.later, thread.encoder, False, 0
    ns.gate, ns.compute = thread.gate, thread.compute
    Worker.inner._check_buckets(ns)
    assert (len(ns.remodes), ns.closed) == (3, True)


def test_a_batch_whose_requests_all_pass_their_limit_leaves_the_rest_to_the_thread() -> None:
    """Checked one bucket at a time: once every request of the batch is past its limit the
    batch stops waiting (its requests draw nothing) and the checks go on in their thread."""

    ns = worker(Slow(8, pause=0.05))
    limit = check_limit(request(5, deadline=0.0))
    late = request(5, deadline=time.time() - limit + 0.2)
    encode, replies = checked(ns, late)
    assert encode == []
    assert replies == [[WorkResult(sampled=False, error=LATE_ERROR)]]
    assert ns.later.pending()  # the rest left to the thread


def test_the_worker_is_ready_only_once_every_bucket_has_passed() -> None:
    """A batch that waits for checks inside the worker teaches BentoML's dispatcher long
    batch times (it then cancelled queued calls): /readyz waits for the checks instead."""
    ns = worker(FixedPasses(8))
    assert Worker.inner.__is_ready__(ns) is False
    Worker.inner._check_later(ns, 128)
    assert Worker.inner.__is_ready__(ns) is False  # 512 left
    Worker.inner._check_later(ns, 512)
    assert Worker.inner.__is_ready__(ns) is True
    ns.closed = True
    assert Worker.inner.__is_ready__(ns) is False


def test_plain_buckets_up_to_64_tokens_get_a_full_pass_larger_ones_do_not() -> None:
    def full(bucket: int):  # type: ignore[no-untyped-def]
        return lambda length, rows, *_: length == bucket and len(rows) == 32

    for bucket, found in [(32, True), (128, False), (512, False)]:
        planted = FixedPasses(32, full(bucket), fixed=False)
        later = LaterChecks(planted, DEFAULT, "later")
        assert bool(later.check(planted)) is found, bucket


def test_the_limit_stays_well_inside_the_workers_call_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Half the goal past the start deadline, but never past 1.5 goals after arrival (the
    call times out at two): a long start timeout must not let a request draw after that."""
    import service.worker as module

    monkeypatch.setattr(module.BOOT, "worker_max_latency_ms", 60_000)
    monkeypatch.setattr(module.BOOT, "worker_start_timeout_ms", 30_000)
    assert check_limit(request(5, deadline=1_000.0)) == 1_030.0  # arrival 970: 60 s after
    monkeypatch.setattr(module.BOOT, "worker_start_timeout_ms", 100_000)
    assert check_limit(request(5, deadline=1_000.0)) == 990.0  # arrival 900: 90 s after


def test_the_encoder_reopened_in_fixed_shape_passes_gets_the_workers_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two worker processes on 2 cores: a thread each, in the mode chosen again too."""
    import sentdp.encoders

    for name in ("SENTDP_WORKER_THREADS", "SENTDP_DEVICE", "SENTDP_WORKER_GPUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SENTDP_WORKER_PROCESSES", "2")
    monkeypatch.setattr("service.settings.usable_cpus", lambda: 2)
    opened: list[dict[str, Any]] = []
    monkeypatch.setattr(sentdp.encoders, "open_encoder", lambda *a, **k: opened.append(k))
    ns = SimpleNamespace(encoder=SimpleNamespace(path="g"), bundle=SimpleNamespace())
    ns.bundle.encoder_backend = "onnx-int8"
    Worker.inner._reopen(ns, "cpu", False)
    ((kwargs,),) = [opened]
    assert (kwargs["threads"], kwargs["fixed_batch"]) == (1, True)
