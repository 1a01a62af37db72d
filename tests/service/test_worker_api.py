"""The worker's BentoML API definitions (service.worker)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from service.scheduling import BATCH_KEY
from service.schemas import WorkItem, WorkReply, WorkRequest
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
