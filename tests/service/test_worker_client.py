"""What a failure on the worker hop means for the charge: not run (refund) or unknown (keep)."""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

import aiohttp
import pytest
from bentoml.exceptions import BentoMLException, ServiceUnavailable

from service.charging import WorkerNotRunError, WorkerOutcomeUnknownError
from service.schemas import WorkItem, WorkReply, WorkRequest, WorkResult
from service.worker_client import BENTOML_503, call_worker

WORK = WorkRequest(
    request_id="r",
    tenant="t",
    deadline=0.0,
    items=[WorkItem(charge_id=1, model="m", variant="v", sentences=["A."], epsilon=1.0, p=1)],
)


class Proxy:
    """A stand-in for ``bentoml.depends(Worker)``: answers or raises what it is given."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.to_async = self
        self.calls: list[str] = []

    async def privatize(self, requests: list[WorkRequest]) -> Any:
        return await self._answer("batched", requests)

    async def privatize_unbatched(self, requests: list[WorkRequest]) -> Any:
        return await self._answer("unbatched", requests)

    async def _answer(self, endpoint: str, requests: list[WorkRequest]) -> Any:
        self.calls.append(endpoint)
        assert requests == [WORK]  # the request travels whole, as one batch item
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def outcome_of(raised: BaseException) -> type[Exception]:
    with pytest.raises((WorkerNotRunError, WorkerOutcomeUnknownError)) as caught:
        asyncio.run(call_worker(Proxy(raised), WORK, batched=True))
    return type(caught.value)


def test_bentomls_own_503_means_the_job_never_ran() -> None:
    body = json.dumps({"error": BENTOML_503})
    assert outcome_of(ServiceUnavailable(body, error_code=HTTPStatus.SERVICE_UNAVAILABLE)) is (
        WorkerNotRunError
    )


@pytest.mark.parametrize(
    "raised",
    [
        ServiceUnavailable("upstream connect error or disconnect/reset before headers"),
        BentoMLException("boom", error_code=HTTPStatus.INTERNAL_SERVER_ERROR),
        BentoMLException("Not able to process", error_code=HTTPStatus.GATEWAY_TIMEOUT),
        aiohttp.ServerDisconnectedError(),
        TimeoutError(),
    ],
)
def test_anything_else_may_have_come_after_sampling(raised: BaseException) -> None:
    assert outcome_of(raised) is WorkerOutcomeUnknownError


def test_a_refused_connection_never_ran() -> None:
    refused = aiohttp.ClientConnectorError(
        aiohttp.client_reqrep.ConnectionKey("h", 1, False, False, None, None, None),
        OSError(111, "refused"),
    )
    assert outcome_of(refused) is WorkerNotRunError


def test_replies_are_parsed_and_the_endpoint_follows_the_batching_choice() -> None:
    reply = {"results": [{"candidate": 3, "sampled": True}]}
    proxy = Proxy([reply])
    assert asyncio.run(call_worker(proxy, WORK, batched=False)) == [
        WorkResult(candidate=3, sampled=True)
    ]
    assert asyncio.run(call_worker(Proxy([WorkReply.model_validate(reply)]), WORK, True))[0].sampled
    assert proxy.calls == ["unbatched"]
