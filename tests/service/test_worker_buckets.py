"""The worker's checks of the length buckets its start-up probes miss (service.worker with
service.invariance.LaterChecks): checked after start-up, before any batch encodes in them,
and a failure that either finds a mode afresh or closes the worker."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from service.invariance import LaterChecks
from service.scheduling import ComputeThread, FairGate
from service.schemas import CLOSED_ERROR, WorkItem, WorkResult
from service.worker import LATER_KEY, Worker
from tests.sentdp.fake_encoders import FixedPasses, real_rows

DEFAULT = [8, 16, 64, 256]  # the fake's buckets the invariance probes reach


def in_bucket(bucket: int):  # type: ignore[no-untyped-def]
    return lambda length, rows, *_: length == bucket and real_rows(rows) >= 2


def worker(encoder: Any, remode: Any = None) -> SimpleNamespace:
    """The worker's state and bucket-checking methods around ``encoder``; ``remode`` stands
    for choosing the mode again (every bucket checked, the failed encoder rejected)."""
    ns = SimpleNamespace(encoder=encoder, encoder_mode="cpu", closed=False)
    ns.later = LaterChecks(encoder, DEFAULT)
    ns.remodes = []

    def choose(every_bucket: bool, rejected: bool = False) -> str:
        ns.remodes.append((every_bucket, rejected))
        if remode is None:
            raise RuntimeError("the encoder's output depends on its batch")
        ns.encoder = remode
        ns.later = LaterChecks(remode, list(range(8, 513)))
        return "cpu-fixed-batch"

    ns._batch_invariant_encoder = choose
    ns._check_later = lambda through: Worker.inner._check_later(ns, through)
    return ns


def items(*lengths: int) -> list[tuple[int, int, WorkItem]]:
    return [
        (
            0,
            n,
            WorkItem(
                charge_id=n, model="m", variant="v", sentences=["a" * length], epsilon=1.0, p=1
            ),
        )
        for n, length in enumerate(lengths)
    ]


def test_a_batch_waits_for_the_buckets_it_needs_and_no_more() -> None:
    ns = worker(FixedPasses(8))
    live = items(20, 100)
    replies: list[list[WorkResult]] = [[]]
    assert Worker.inner._checked_buckets(ns, live, replies) == live
    assert ns.later.pending() == [512]
    assert Worker.inner._checked_buckets(ns, items(5), replies) == items(5)
    assert ns.later.pending() == [512]  # a batch of the default buckets checks nothing


def test_a_fault_found_later_chooses_the_mode_again_and_the_batch_encodes_with_it() -> None:
    fixed = FixedPasses(8)
    ns = worker(FixedPasses(8, in_bucket(128), fixed=False), remode=fixed)
    live = items(100)
    assert Worker.inner._checked_buckets(ns, live, [[None]]) == live
    assert ns.remodes == [(True, True)]
    assert (ns.encoder, ns.encoder_mode, ns.closed) == (fixed, "cpu-fixed-batch", False)
    assert ns.later.pending() == []


def test_when_no_mode_passes_the_worker_refuses_every_item_and_is_not_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = worker(FixedPasses(8, in_bucket(32), fixed=False))
    replies: list[list[Any]] = [[None, None]]
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        assert Worker.inner._checked_buckets(ns, items(20, 5), replies) == []
    assert ns.closed
    assert replies == [[WorkResult(sampled=False, error=CLOSED_ERROR)] * 2]
    assert Worker.inner.__is_ready__(ns) is False
    events = {r.sentdp_fields["event"]: r for r in caplog.records if hasattr(r, "sentdp_fields")}
    assert events["encoder_bucket_moved"].levelno == logging.WARNING
    assert events["encoder_bucket_moved"].sentdp_fields["where"].startswith("bucket 32: probe ")
    refusing = events["worker_refusing_to_serve"]
    assert (refusing.levelno, refusing.sentdp_fields["error"]) == (logging.ERROR, "RuntimeError")
    assert "depends on its batch" not in str(refusing.sentdp_fields)
    again: list[list[Any]] = [[None]]  # later batches are refused without checking again
    assert Worker.inner._checked_buckets(ns, items(5), again) == []
    assert again == [[WorkResult(sampled=False, error=CLOSED_ERROR)]]
    assert ns.remodes == [(True, True)]


def test_a_batch_whose_sentences_cannot_be_tokenized_waits_for_every_bucket() -> None:
    class Untokenizable(FixedPasses):
        def buckets_of(self, sentences):  # type: ignore[no-untyped-def]
            if any("\x00" in s for s in sentences):
                raise ValueError("cannot tokenize")
            return super().buckets_of(sentences)

    ns = worker(Untokenizable(8))
    live = [
        (0, 0, WorkItem(charge_id=1, model="m", variant="v", sentences=["\x00"], epsilon=1.0, p=1))
    ]
    assert Worker.inner._checked_buckets(ns, live, [[None]]) == live
    assert ns.later.pending() == []


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
    checked = [
        r.sentdp_fields["bucket"]
        for r in caplog.records
        if getattr(r, "sentdp_fields", {}).get("event") == "encoder_bucket_checked"
    ]
    assert checked == [32, 128, 512]
    assert ns.later.pending() == []


def test_the_checking_thread_stops_once_the_worker_refuses_to_serve() -> None:
    ns = worker(FixedPasses(8, in_bucket(128), fixed=False))
    ns.gate, ns.compute = CountingGate(), ComputeThread()
    Worker.inner._check_buckets(ns)
    assert ns.closed
    assert ns.gate.keys == [LATER_KEY] * 2  # 32 passed; 128 moved and no mode passed
    assert ns.later.pending() == [128, 512]


def test_every_batch_passes_the_bucket_checks_before_it_is_planned() -> None:
    from service.schemas import WorkRequest

    ns = worker(FixedPasses(8))
    planned: list[list[str]] = []

    def plans(live: list[WorkItem], tenants: list[str]) -> list[Any]:
        planned.append(ns.later.pending())
        return ["stopped before sampling"] * len(live)

    ns._refusal = lambda item: None
    ns._checked_buckets = lambda live, replies: Worker.inner._checked_buckets(ns, live, replies)
    ns._plans = plans
    ns.trim_memory = lambda sentences: None
    request = WorkRequest(
        request_id="r", tenant="t", deadline=4e9, items=[item for *_, item in items(100)]
    )
    (reply,) = Worker.inner._compute(ns, [request])
    assert planned == [[512]]
    assert reply.results == [WorkResult(sampled=False, error="stopped before sampling")]
    ns.closed = True
    (reply,) = Worker.inner._compute(ns, [request])
    assert reply.results == [WorkResult(sampled=False, error=CLOSED_ERROR)]
