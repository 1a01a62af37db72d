"""The gateway's readiness: the worker's probe, then one dispatcher warm-up per worker start."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from service.gateway import Gateway
from service.schemas import WorkReply, WorkRequest
from service.worker_client import DISPATCHER_TRAINING_CALLS


class Worker:
    """A stand-in for the worker proxy: probe answers from a script, warm-up calls counted."""

    def __init__(self, probes: Iterable[bool | BaseException]) -> None:
        self.probes = iter(probes)
        self.to_async = self
        self.warm_up_calls = 0

    async def is_ready(self, timeout: int) -> bool:
        outcome = next(self.probes)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def privatize(self, requests: list[WorkRequest]) -> list[WorkReply]:
        assert all(not r.items for r in requests)
        self.warm_up_calls += 1
        await asyncio.sleep(0)
        return [WorkReply(results=[])]


def gateway(worker: Worker, batching: bool = True) -> Any:
    """A Gateway with only what readiness reads (its __init__ loads a bundle and a ledger)."""
    gate: Any = Gateway.inner.__new__(Gateway.inner)
    gate.worker = worker
    gate.settings = SimpleNamespace(adaptive_batching=batching)
    gate._ready_until = 0.0
    gate._worker_starts = 0
    gate._warmed_for = -1
    gate._warming = asyncio.Lock()
    gate.charging = SimpleNamespace(worker_closed=False)
    return gate


async def probe(gate: Any) -> bool:
    gate._ready_until = 0.0  # every call reaches the worker's probe (no 1 s cache)
    return bool(await gate.__is_ready__())


def test_the_first_ready_probe_warms_the_dispatcher_before_it_answers() -> None:
    worker = Worker([False, True, True, True])
    gate = gateway(worker)

    async def run() -> list[tuple[bool, int]]:
        return [(await probe(gate), worker.warm_up_calls) for _ in range(4)]

    n = DISPATCHER_TRAINING_CALLS
    assert asyncio.run(run()) == [(False, 0), (True, n), (True, n), (True, n)]


def test_concurrent_probes_share_one_warm_up() -> None:
    worker = Worker([True] * 3)
    gate = gateway(worker)

    async def run() -> list[bool]:
        return list(await asyncio.gather(*(probe(gate) for _ in range(3))))

    assert asyncio.run(run()) == [True, True, True]
    assert worker.warm_up_calls == DISPATCHER_TRAINING_CALLS


def test_a_worker_seen_down_is_warmed_again_when_it_answers() -> None:
    worker = Worker([True, ConnectionRefusedError(), True, False, True])
    gate = gateway(worker)

    async def run() -> list[bool]:
        return [await probe(gate) for _ in range(5)]

    assert asyncio.run(run()) == [True, False, True, False, True]
    assert worker.warm_up_calls == 3 * DISPATCHER_TRAINING_CALLS


def test_a_slow_probe_of_a_busy_worker_does_not_ask_for_another_warm_up() -> None:
    worker = Worker([True, TimeoutError(), True])
    gate = gateway(worker)

    async def run() -> list[bool]:
        return [await probe(gate) for _ in range(3)]

    assert asyncio.run(run()) == [True, False, True]
    assert worker.warm_up_calls == DISPATCHER_TRAINING_CALLS


def test_without_adaptive_batching_nothing_is_warmed() -> None:
    worker = Worker([True])
    assert asyncio.run(probe(gateway(worker, batching=False))) is True
    assert worker.warm_up_calls == 0


def test_once_a_worker_process_refused_to_serve_the_gateway_is_never_ready_again() -> None:
    """With several worker processes the probe reaches one of them, which may be healthy;
    a reply from one that refuses to serve marks the gateway not ready, cache or not."""
    worker = Worker([True, True])
    gate = gateway(worker)

    async def run() -> list[bool]:
        first = await probe(gate)
        gate.charging.worker_closed = True
        return [first, await gate.__is_ready__(), await probe(gate)]

    assert asyncio.run(run()) == [True, False, False]
    assert list(worker.probes) == [True]  # the probe was not asked again
