"""The gateway's side of the worker hop: which endpoint, what a failure means, and a client
that never drops a response the worker has already produced.

:func:`call_worker` turns transport failures into the two outcomes the charging flow knows:
:class:`~service.charging.WorkerNotRunError` (connection refused, or BentoML's own 503 for a
request cancelled before dispatch: no randomness was drawn) and
:class:`~service.charging.WorkerOutcomeUnknownError` (a 500, a timeout, a connection dropped after
the request was sent: the worker may have sampled). :func:`warm_dispatcher` trains the
worker's batching dispatcher on empty calls before the gateway reports ready.

BentoML 1.4.39's internal client (``_bentoml_impl.client.proxy2.SessionManager``) replaces
its aiohttp session every 100 requests or 300 s and *closes the old one with requests still
in flight*; under load those requests fail with ``ServerDisconnectedError`` after the worker
has sampled (measured: 4 to 22 of 96 requests at concurrency 32; BentoML issues #5540,
#5544). For sentdp that means a charged, sampled document whose embedding never reaches the
caller. Its pooled keep-alive connections can also go stale against uvicorn's 5 s keep-alive
timeout (BentoML issue #4971), which fails a request at an unknowable point.

:func:`harden` therefore keeps one session for the life of the process and gives it a
connector that opens a fresh connection per request (``force_close``: a Unix-socket connect
costs microseconds). bentoml is pinned to 1.4.39 in pyproject.toml; the test suite's
200-way concurrency test would catch a regression.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from http import HTTPStatus
from typing import Any
from urllib.parse import urlparse

from service.charging import WorkerNotRunError, WorkerOutcomeUnknownError
from service.errors import Code
from service.schemas import WorkReply, WorkRequest, WorkResult

BENTOML_503 = "An unexpected error has occurred, please check the server log."
"""The body BentoML's worker process sends with its own 503, which it raises only before a
job runs: the dispatcher's fallback for a cancelled job ("process is overloaded", whose
message BentoML replaces by this one for every 5xx) and the overload guard
(``_bentoml_impl/server/app.py``). The worker's own code never raises a 503, and a timeout is
a 504. Any other 503 (a proxy between the services, say) may come after the worker sampled,
so it is not taken as "not run"."""


async def call_worker(proxy: Any, work: WorkRequest, batched: bool) -> list[WorkResult]:
    """The worker's results for one request through the adaptive-batched endpoint or its
    non-batchable twin; failures raised as :class:`WorkerNotRunError` or
    :class:`WorkerOutcomeUnknownError`. The request travels as one batch item, so BentoML
    never splits it between a batch that runs and one that is cancelled."""
    import aiohttp
    import bentoml

    endpoint = proxy.to_async.privatize if batched else proxy.to_async.privatize_unbatched
    try:
        replies = await endpoint([work])
    except aiohttp.ClientConnectorError as error:
        raise WorkerNotRunError("worker unreachable") from error
    except bentoml.exceptions.BentoMLException as error:
        if error.error_code == HTTPStatus.SERVICE_UNAVAILABLE and BENTOML_503 in str(error):
            raise WorkerNotRunError("worker busy (cancelled before dispatch)") from error
        raise WorkerOutcomeUnknownError(
            Code.MECHANISM_FAILED,
            "the worker failed after the budget was charged; the charge stands",
        ) from error
    except (aiohttp.ClientError, TimeoutError) as error:
        raise WorkerOutcomeUnknownError(
            Code.WORKER_RESPONSE_LOST,
            "the worker's answer was lost after the budget was charged; the charge stands",
        ) from error
    (reply,) = replies
    parsed = reply if isinstance(reply, WorkReply) else WorkReply.model_validate(reply)
    return parsed.results


DISPATCHER_TRAINING_CALLS = 11
"""Batches BentoML 1.4.39's adaptive-batching dispatcher (``CorkDispatcher.controller``)
dispatches as training before it batches freely: eight, then one, then a batch it holds until
two calls are queued and one it holds until three are, each hold bounded by a multiple of the
batch times measured so far. At concurrency 1 the last two are single user requests held
about 1.5 and 2 batch times: 0.3 and 0.4 s with 0.2 s batches (in-process, BentoML's
dispatcher), about 11 ms per request of a 60-request run at concurrency 1 after 8 warm-up
requests (torch and int8 encoders on a slow 2-core machine; docs/performance.md, "The batching
dispatcher's training")."""


WARM_UP_SECONDS = 2.0
"""At most this long for the dispatcher warm-up (0.04 s measured; longer only behind a busy
worker's batch, where the remaining calls are left to the dispatcher's own training)."""


async def warm_dispatcher(
    proxy: Any, calls: int = DISPATCHER_TRAINING_CALLS, seconds: float = WARM_UP_SECONDS
) -> int:
    """Train the worker's batching dispatcher on ``calls`` empty requests, one after another
    (calls sent at once would be dispatched as one training batch), so that its training
    holds no user's request; how many were answered before the first failure or the end of
    ``seconds``. The worker answers a request without items at once (no gate, no
    computation, no metrics, and its deadline never extends a batch's wait), so the
    dispatcher measures near-zero batch times and holds each training batch only as long."""
    ends = time.monotonic() + seconds
    answered = 0
    for n in range(calls):
        left = ends - time.monotonic()
        if left <= 0:
            return answered
        work = WorkRequest(
            request_id=f"warm-up-{n}", tenant="warm-up", deadline=time.time() + left, items=[]
        )
        try:
            await asyncio.wait_for(proxy.to_async.privatize([work]), left)
        except Exception:  # a timeout or a failing worker: the caller logs how far this got
            return answered
        answered += 1
    return answered


def harden(proxy: Any) -> None:
    """Apply the fix to a ``bentoml.depends`` proxy of the worker (no-op when in-process)."""
    manager = getattr(getattr(proxy, "to_async", None), "_session_manager", None)
    if manager is None or getattr(manager, "_app", None) is not None:
        return
    import aiohttp

    manager.max_requests = sys.maxsize
    manager.max_age = math.inf
    parsed = urlparse(manager._parsed_url.geturl())

    def make_client() -> aiohttp.ClientSession:
        connector: aiohttp.BaseConnector
        if parsed.scheme == "file":
            from bentoml._internal.utils.uri import uri_to_path

            connector = aiohttp.UnixConnector(path=uri_to_path(parsed.geturl()), force_close=True)
            base_url = "http://127.0.0.1:3000"
        else:
            connector = aiohttp.TCPConnector(force_close=True)
            base_url = f"http://{parsed.netloc}" if parsed.scheme == "tcp" else parsed.geturl()
        return aiohttp.ClientSession(
            base_url=base_url,
            headers=manager._headers,
            timeout=manager._timeout,
            connector=connector,
        )

    manager._make_client = make_client
