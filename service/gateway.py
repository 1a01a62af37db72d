"""The HTTP gateway: BentoML's adapter around the charging flow, the lookups and the budget.

Each API turns its BentoML call into a plain request for :mod:`service.charging` (charged
documents), :mod:`service.lookup` (free labels) or the ledger (budget), and its reply back into
an HTTP response. Authentication and body limits run before parsing, in
:mod:`service.guard`. The gateway never imports torch.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import bentoml
from starlette.responses import JSONResponse, Response

from sentdp.bundle import Bundle
from sentdp.encoders import TokenCounter
from sentdp.text import TextLimits
from service import housekeeping, logs
from service.charging import ChargedRequest, Charging, Reply
from service.errors import ApiError, Code, classify_forms_error
from service.guard import GuardMiddleware
from service.http_metrics import bound_paths
from service.idempotency import load_signer
from service.ledger import open_ledger
from service.ledger.sql import PURGE_CHUNK_ROWS
from service.lookup import Lookups
from service.metrics import protect_metrics_folder
from service.schemas import (
    Budget,
    BudgetRequest,
    ClassifyRequest,
    ClassifyResponse,
    DocumentIn,
    PrivatizeRequest,
    PrivatizeResponse,
    WorkRequest,
    WorkResult,
)
from service.settings import (
    ACCESS_LOG,
    ServiceSettings,
    boot_settings,
    load_settings,
)
from service.state import EphemeralStateError, check_state_survives
from service.tenants import Tenant, TenantRegistry, TenantSource
from service.validation import Limits
from service.views import budget_view
from service.worker import Worker
from service.worker_client import (
    DISPATCHER_TRAINING_CALLS,
    call_worker,
    harden,
    warm_dispatcher,
)

BOOT = boot_settings()
logs.json_for_bentoml()  # in `bentoml serve`'s own process too, which imports this module


@functools.cache
def tenant_source() -> TenantSource:
    """This process's view of the tenants file, shared by the middleware and the APIs."""
    return TenantSource(load_settings().tenants_file)


def _registry() -> TenantRegistry:
    return tenant_source().registry()


READY_PROBE_SECONDS = 2.0
READY_CACHE_SECONDS = 1.0
SHUTDOWN_SETTLE_SECONDS = 20.0
"""How long a stopping gateway waits for reserved work whose request was cancelled (within
a container runtime's usual grace period: Kubernetes gives 30 s)."""


@bentoml.service(
    name="sentdp",
    workers=BOOT.gateway_count(),
    logging=ACCESS_LOG,
    traffic={"timeout": BOOT.gateway_timeout_s()},
    # BentoML's own probe of the worker can hold /readyz until the request timeout (150 s)
    # while the worker starts; __is_ready__ probes it with a deadline instead.
    runner_probe={"enabled": False},
)
class Gateway:
    worker = bentoml.depends(Worker)
    bundle_model = bentoml.models.BentoModel(BOOT.model)

    def __init__(self) -> None:
        logs.configure()
        self.settings: ServiceSettings = load_settings()
        try:
            check_state_survives(self.settings)
        except EphemeralStateError as problem:  # exception messages are redacted in logs
            logs.log_event("refusing_to_start", logging.ERROR, reason=str(problem))
            raise
        stored = self.bundle_model
        version = str(stored.tag)
        bundle = Bundle.load(Path(stored.path))
        self.tenants = tenant_source()
        self.ledger = open_ledger(
            self.settings.ledger_url,
            self.settings.ledger_schema,
            self.settings.idempotency_pending_seconds,
        )
        self._record_period_ends()
        harden(self.worker)
        limits = Limits(
            self.settings.max_documents,
            TextLimits(self.settings.max_sentences, self.settings.max_sentence_chars),
            self.settings.max_request_sentences,
            self.settings.max_request_tokens,
            self.settings.tenant_inflight_tokens,
            self.settings.worker_start_timeout_ms / 1000,
            self.settings.tenant_checks,
            self.settings.tenant_checks_waiting,
            self.settings.tenant_inflight_requests,
            self.settings.tenant_stored_reply_bytes,
        )
        counter = TokenCounter(bundle.encoder_dir, int(bundle.manifest.encoder["max_tokens"]))
        signer = load_signer(self.settings.idempotency_secret_file, self.ledger)
        self.charging = Charging(
            bundle, version, self.ledger, self._run_worker, limits, signer, counter.padded_tokens
        )
        self.lookups = Lookups(bundle, version)
        self._ready_until = 0.0
        self._worker_starts = 0  # failed worker probes seen: each may be a (re)start
        self._warmed_for = -1  # the value of _worker_starts the dispatcher was warmed for
        self._warming = asyncio.Lock()
        if os.environ.get("BENTOML_DO_NOT_TRACK", "").lower() != "true":
            logs.log_event(  # the server's process read it at start; too late to change here
                "usage_tracking_on",
                logging.WARNING,
                reason="BentoML sends usage reports (request counts by endpoint and status) "
                "to its makers; start the server with BENTOML_DO_NOT_TRACK=true to stop them",
            )
        logs.log_event("gateway_ready", model=version)

    # --- the API ---------------------------------------------------------------------------
    @bentoml.api(input_spec=PrivatizeRequest)
    async def privatize(
        self, ctx: bentoml.Context, user: str, epsilon: float, documents: list[DocumentIn]
    ) -> PrivatizeResponse:
        """Privatize one user's documents: one epsilon-SentDP embedding per document."""
        return await self._charged(ctx, user, epsilon, documents, with_labels=False)

    @bentoml.api(input_spec=ClassifyRequest)
    async def classify(
        self,
        ctx: bentoml.Context,
        user: str | None = None,
        epsilon: float | None = None,
        documents: list[DocumentIn] | None = None,
        model: str | None = None,
        candidates: list[int] | None = None,
    ) -> ClassifyResponse:
        """Documents -> private embedding -> class label (one charge, as /privatize); or
        (model, candidate ids) already released -> labels at no charge."""
        # Either form whole and alone: a field of the other form is refused, never ignored
        # (a ``model`` beside documents would not pin the version that is charged).
        if documents is None:
            if model is None or candidates is None or user is not None or epsilon is not None:
                return self._error(ctx, classify_forms_error())
            tenant = self._tenant(ctx)
            if tenant is None:
                return self._error(ctx, unauthorized())
            try:
                found = await self.charging.read(tenant.id, self.lookups.labels, model, candidates)
            except ApiError as error:
                return self._error(ctx, error)
            body = json.dumps(found.model_dump(mode="json", exclude_none=True))
            reply: Any = self._respond(ctx, Reply(200, body))  # no null fields, as /privatize's
            return reply
        if candidates is not None or model is not None or user is None or epsilon is None:
            return self._error(ctx, classify_forms_error())
        return await self._charged(ctx, user, epsilon, documents, with_labels=True)

    def _record_period_ends(self) -> None:
        """Record the end of periods opened before schema 4 (see the ledger's
        ``record_period_ends``). Best effort: the ledger stays correct without it."""
        for tenant in self.tenants.registry().tenants():
            try:
                self.ledger.record_period_ends(tenant.id, tenant.policy)
            except Exception:
                logging.getLogger("sentdp.service").exception(
                    "could not record period ends for a tenant; they stay as before"
                )

    @bentoml.api(input_spec=BudgetRequest)
    async def budget(self, ctx: bentoml.Context, user: str) -> Budget:
        """The user's spending in this period and what remains."""
        tenant = self._tenant(ctx)
        if tenant is None:
            return self._error(ctx, unauthorized())
        try:
            account = await self.charging.read(
                tenant.id, self.ledger.account, tenant.id, user, tenant.policy, ledger=True
            )
        except ApiError as error:
            return self._error(ctx, error)
        return budget_view(account, tenant.policy)

    @bentoml.on_startup
    async def _start_housekeeping(self) -> None:
        """Start the timer that purges expired idempotency rows (stored replies, with their
        embeddings and user ids) although no charged request comes to trigger it."""
        self._housekeeping = housekeeping.start(self.charging.housekeep, PURGE_CHUNK_ROWS)

    @bentoml.on_shutdown
    async def _settle_before_stopping(self) -> None:
        """Give reserved work still running (requests cancelled while the worker ran) time to
        settle before the process stops; what does not end in time stays reserved."""
        timer = getattr(self, "_housekeeping", None)
        if timer is not None:
            timer.cancel()
        await self.charging.drain(SHUTDOWN_SETTLE_SECONDS)

    async def __is_ready__(self) -> bool:
        """Ready once the worker answers its own /readyz and, after each worker start seen,
        its batching dispatcher is warmed (at most ``WARM_UP_SECONDS`` of
        :mod:`service.worker_client` more); a worker that is still starting (or gone) makes
        /readyz answer 503 within READY_PROBE_SECONDS, never hang. Never ready again once a
        worker process answered that it refuses to serve (``Charging.worker_closed``)."""
        if self.charging.worker_closed:  # a worker process refuses to serve, for good
            return False
        probe = getattr(self.worker, "is_ready", None)
        if probe is None:  # the worker runs in this process
            return True
        if time.monotonic() < self._ready_until:  # probe storms cost one worker call a second
            return True
        try:
            ready = bool(await asyncio.wait_for(probe(1), READY_PROBE_SECONDS))
        except TimeoutError:  # a busy worker answers late: not ready now, but not restarted
            return False
        except Exception:  # refused: the worker is starting, restarting or gone
            ready = False
        if not ready:
            self._worker_starts += 1  # the next worker to answer needs its dispatcher trained
            return False
        if self._warmed_for != self._worker_starts:
            await self._warm_dispatcher()
        self._ready_until = time.monotonic() + READY_CACHE_SECONDS
        return True

    async def _warm_dispatcher(self) -> None:
        """Once per worker start seen: train the worker's batching dispatcher on empty calls
        (see :func:`~service.worker_client.warm_dispatcher`). Readiness waits for it; a
        failure only costs the first requests' latency, so it is logged, not fatal."""
        async with self._warming:
            start = self._worker_starts  # a probe failing meanwhile asks for another warm-up
            if self._warmed_for == start:
                return
            if self.settings.adaptive_batching:
                started = time.perf_counter()
                answered = await warm_dispatcher(self.worker)
                level = logging.INFO if answered == DISPATCHER_TRAINING_CALLS else logging.WARNING
                seconds = round(time.perf_counter() - started, 3)
                logs.log_event("worker_dispatcher_warmed", level, calls=answered, seconds=seconds)
            self._warmed_for = start

    # --- adapters --------------------------------------------------------------------------
    async def _charged(
        self,
        ctx: bentoml.Context,
        user: str,
        epsilon: float,
        documents: list[DocumentIn],
        with_labels: bool,
    ) -> Any:
        tenant = self._tenant(ctx)
        caller = getattr(ctx.request.state, "sentdp_caller", None)
        if tenant is None or caller is None:
            return self._error(ctx, unauthorized())
        request = ChargedRequest(
            tenant=tenant,
            user=user,
            epsilon=epsilon,
            documents=documents,
            caller=caller,
            with_labels=with_labels,
            idempotency_key=ctx.request.headers.get("idempotency-key"),
        )
        return self._respond(ctx, await self.charging.handle(request))

    async def _run_worker(self, work: WorkRequest) -> list[WorkResult]:
        sentences = sum(len(item.sentences) for item in work.items)
        batched = (
            self.settings.adaptive_batching
            and sentences <= self.settings.batch_max_sentences
            and work.cost <= self.settings.batch_max_tokens
        )
        return await call_worker(self.worker, work, batched)

    def _tenant(self, ctx: bentoml.Context) -> Tenant | None:
        tenant_id = getattr(ctx.request.state, "sentdp_tenant", None)
        return self.tenants.registry().get(tenant_id) if tenant_id else None

    @staticmethod
    def _respond(ctx: bentoml.Context, reply: Reply) -> Response:
        ctx.response.status_code = reply.status
        headers = {**reply.headers, **({"Idempotent-Replayed": "true"} if reply.replayed else {})}
        if headers:
            ctx.response.headers.update(headers)
        return Response(
            reply.body, status_code=reply.status, media_type="application/json", headers=headers
        )

    @staticmethod
    def _error(ctx: bentoml.Context, error: ApiError) -> Any:
        """A JSONResponse (Any: the APIs declare their success model for the OpenAPI spec)."""
        ctx.response.status_code = error.status
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def unauthorized() -> ApiError:
    return ApiError(Code.UNAUTHORIZED, "missing or invalid API key")


protect_metrics_folder()  # at import, before any server process writes a metric file
_services: tuple[Any, ...] = (Gateway, Worker)
bound_paths(api.route for service in _services for api in service.apis.values())
Gateway.add_asgi_middleware(  # type: ignore[attr-defined]
    GuardMiddleware,
    registry_loader=_registry,
    max_body_bytes=BOOT.max_body_bytes,
    tenant_inflight_bytes=BOOT.inflight_bytes(),
    body_timeout=BOOT.body_timeout_s,
    max_json_depth=BOOT.max_json_depth,
    metrics_token=BOOT.metrics_token,
)
