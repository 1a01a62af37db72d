"""The worker's BentoML API definitions (service.worker)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from service.scheduling import BATCH_KEY, Turn
from service.schemas import BACKLOG_ERROR, LATE_ERROR, WorkItem, WorkReply, WorkRequest
from service.worker import Worker


def test_worker_replies_declare_their_media_type() -> None:
    """An undeclared list reply makes BentoML rebuild its JSON schema on every response to
    find the media type; the worker declares it, so no API of the worker leaves it open."""
    assert set(Worker.apis) == {"privatize", "privatize_unbatched"}
    for name, api in Worker.apis.items():
        assert api.output_spec.media_type == "application/json", name
        assert api.output_spec.mime_type() == "application/json", name


class Refuse:
    """A gate and compute thread that fail the test if anything reaches them."""

    def turn(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("the request took the gate")

    def run(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("the request reached the compute thread")


def _request(items: list[WorkItem]) -> WorkRequest:
    return WorkRequest(request_id="w", tenant="warm-up", deadline=0.0, items=items)


def test_requests_without_items_answer_at_once_without_the_gate() -> None:
    """The gateway's dispatcher warm-up sends empty requests: they must not wait for a
    tenant's turn, occupy the compute thread or count as batches."""
    worker = SimpleNamespace(gate=Refuse(), compute=Refuse())
    replies = Worker.inner._run(worker, [_request([]), _request([])], BATCH_KEY)
    assert replies == [WorkReply(results=[]), WorkReply(results=[])]


def test_a_batch_with_any_item_still_takes_its_turn() -> None:
    item = WorkItem(charge_id=1, model="m", variant="v", sentences=["A."], epsilon=1.0, p=1)
    worker = SimpleNamespace(gate=Refuse(), compute=Refuse())
    with pytest.raises(AssertionError, match="gate"):
        Worker.inner._run(worker, [_request([]), _request([item])], BATCH_KEY)


class Closed:
    """A gate whose turn never comes: records the deadline it was asked to wait until."""

    def __init__(self, behind_own: bool = False) -> None:
        self.deadlines: list[float] = []
        self.keys: list[object] = []
        self.behind_own = behind_own

    @contextmanager
    def turn(self, key: object, deadline: float | None = None) -> Iterator[Turn]:
        self.deadlines.append(deadline or 0.0)
        self.keys.append(key)
        yield Turn(False, self.behind_own)


def test_an_empty_request_never_extends_the_wait_of_the_users_it_is_batched_with() -> None:
    """The batch waits for its turn until its users' last deadline, never a warm-up call's
    later one (waiting past a user's deadline can outlast the gateway's timeout)."""
    item = WorkItem(charge_id=1, model="m", variant="v", sentences=["A."], epsilon=1.0, p=1)
    user = WorkRequest(request_id="u", tenant="t", deadline=100.0, items=[item])
    warm_up = WorkRequest(request_id="w", tenant="warm-up", deadline=200.0, items=[])
    gate = Closed()
    replies = Worker.inner._run(SimpleNamespace(gate=gate), [warm_up, user], BATCH_KEY)
    assert gate.deadlines == [100.0]
    assert replies[1].results[0].sampled is False  # not started: refunded, nothing drawn


def call_endpoint(name: str, gate: Closed, requests: list[WorkRequest]) -> list[WorkReply]:
    """The worker API ``name``'s own function on a worker holding only ``gate``."""
    worker = SimpleNamespace(gate=gate, _run=lambda r, k: Worker.inner._run(worker, r, k))
    replies: list[WorkReply] = Worker.apis[name].func(worker, requests)
    return replies


@pytest.mark.parametrize(
    ("batched", "behind_own", "error"),
    [
        (False, True, BACKLOG_ERROR),
        (False, False, LATE_ERROR),
        (True, True, LATE_ERROR),  # a batch's key is every tenant's: no tenant's own backlog
    ],
)
def test_a_late_request_says_whether_its_own_tenant_s_requests_held_the_worker(
    batched: bool, behind_own: bool, error: str
) -> None:
    item = WorkItem(charge_id=1, model="m", variant="v", sentences=["A."], epsilon=1.0, p=1)
    user = WorkRequest(request_id="u", tenant="adaptive-batch", deadline=100.0, items=[item])
    gate = Closed(behind_own)
    (reply,) = call_endpoint("privatize" if batched else "privatize_unbatched", gate, [user])
    assert reply.results[0].sampled is False
    assert reply.results[0].error == error
    # A tenant named like the batches' key still waits under a key of its own.
    assert gate.keys == [BATCH_KEY if batched else ("tenant", "adaptive-batch")]


def test_an_unbatched_call_of_several_tenants_waits_under_no_tenant_s_key() -> None:
    """The gateway sends one request per unbatched call; were it ever to send several
    tenants' at once, none of them would be told the others' backlog was its own."""
    item = WorkItem(charge_id=1, model="m", variant="v", sentences=["A."], epsilon=1.0, p=1)
    requests = [
        WorkRequest(request_id=f"u{n}", tenant=tenant, deadline=100.0, items=[item])
        for n, tenant in enumerate(("t1", "t2"))
    ]
    gate = Closed(behind_own=True)
    replies = call_endpoint("privatize_unbatched", gate, requests)
    assert gate.keys == [BATCH_KEY]
    assert [reply.results[0].error for reply in replies] == [LATE_ERROR, LATE_ERROR]
