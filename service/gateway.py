"""The HTTP gateway: validation, the budget ledger, idempotency and responses.

Order of work for every charged request: authenticate (middleware) -> validate and split ->
one atomic check-and-debit (with the idempotency key) -> the worker's mechanism -> settle
(final or refunded charges, stored response) -> respond. Refunds happen only for documents
whose mechanism certainly drew no randomness. The gateway never imports torch.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import time
import uuid
from http import HTTPStatus
from pathlib import Path
from typing import Any

import bentoml
from starlette.responses import JSONResponse, Response

from sentdp.accounting import Charge, charge_for, epsilon_of_charge, to_epsilon
from sentdp.bundle import Bundle, PChoice
from sentdp.errors import InputError, LimitError
from sentdp.mechanism import privacy_slack
from sentdp.text import SentenceSplitter, TextLimits, prepare_sentences, split_document
from service.guard import GuardMiddleware
from service.ledger import open_ledger
from service.ledger.base import (
    Account,
    BudgetExhaustedError,
    IdempotencyInFlightError,
    IdempotencyKey,
    IdempotencyMismatchError,
    Replay,
    Reservation,
)
from service.metrics import metric
from service.schemas import (
    Budget,
    BudgetRequest,
    CandidateLabel,
    ClassifyRequest,
    ClassifyResponse,
    DocumentIn,
    PrivateDocument,
    PrivatizeRequest,
    PrivatizeResponse,
    WorkItem,
    WorkResult,
)
from service.settings import ServiceSettings, load_settings
from service.tenants import Tenant, TenantRegistry
from service.worker import _BOOT, Worker
from service.worker_client import harden

MAX_KEY_LENGTH = 200


class ApiError(Exception):
    """A refusal with its HTTP status, a machine-readable code and what to fix."""

    def __init__(self, status: int, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details


def classify_forms_error() -> ApiError:
    return ApiError(
        400,
        "invalid_body",
        "classify takes either user, epsilon and documents, or model and candidates",
    )


def _registry() -> TenantRegistry:
    return TenantRegistry.load(load_settings().tenants_file)


@bentoml.service(
    name="sentdp",
    workers=_BOOT.gateway_workers,
    traffic={"timeout": _BOOT.worker_max_latency_ms / 1000 * 2 + 30},
)
class Gateway:
    worker = bentoml.depends(Worker)
    bundle_model = bentoml.models.BentoModel(_BOOT.model)

    def __init__(self) -> None:
        self.settings: ServiceSettings = load_settings()
        stored = self.bundle_model
        self.version = str(stored.tag)
        self.bundle = Bundle.load(Path(stored.path))
        self.lookups: dict[str, Bundle] = {self.version: self.bundle}
        self.splitter = SentenceSplitter()
        self.limits = TextLimits(self.settings.max_sentences, self.settings.max_sentence_chars)
        self.tenants = _registry()
        self.ledger = open_ledger(
            self.settings.ledger_url,
            self.settings.ledger_schema,
            self.settings.idempotency_pending_seconds,
        )
        self.secret = self.ledger.hmac_secret()
        harden(self.worker)
        self.slack = {
            v.record.name: privacy_slack(v.record.candidates) for v in self.bundle.variants
        }

    # --- the API ---------------------------------------------------------------------------
    @bentoml.api(input_spec=PrivatizeRequest)
    async def privatize(
        self,
        ctx: bentoml.Context,
        user: str,
        epsilon: float,
        documents: list[DocumentIn],
    ) -> PrivatizeResponse:
        """Privatize one user's documents: one epsilon-SentDP embedding per document."""
        return await self._guarded(ctx, self._privatize(ctx, user, epsilon, documents, False))

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
        work = self._classify(ctx, user, epsilon, documents, model, candidates)
        return await self._guarded(ctx, work)

    @bentoml.api(input_spec=BudgetRequest)
    async def budget(self, ctx: bentoml.Context, user: str) -> Budget:
        """The user's spending in this period and what remains."""
        return await self._guarded(ctx, self._budget(ctx, user))

    async def __is_ready__(self) -> bool:
        return True

    # --- request handling --------------------------------------------------------------------
    async def _guarded(self, ctx: bentoml.Context, work: Any) -> Any:
        try:
            return await work
        except ApiError as error:
            return self._error(ctx, error)

    def _error(self, ctx: bentoml.Context, error: ApiError) -> Response:
        ctx.response.status_code = error.status
        body = {"error": {"code": error.code, "message": str(error), **error.details}}
        return JSONResponse(body, status_code=error.status)

    def _tenant(self, ctx: bentoml.Context) -> Tenant:
        tenant_id = getattr(ctx.request.state, "sentdp_tenant", None)
        tenant = self.tenants.get(tenant_id) if tenant_id else None
        if tenant is None:
            raise ApiError(401, "unauthorized", "missing or invalid API key")
        return tenant

    async def _classify(
        self,
        ctx: bentoml.Context,
        user: str | None,
        epsilon: float | None,
        documents: list[DocumentIn] | None,
        model: str | None,
        candidates: list[int] | None,
    ) -> Any:
        if documents is None:
            return await self._lookup(model, candidates)
        if candidates is not None or user is None or epsilon is None:
            raise classify_forms_error()
        return await self._privatize(ctx, user, epsilon, documents, True)

    async def _budget(self, ctx: bentoml.Context, user: str) -> Budget:
        tenant = self._tenant(ctx)
        account = await self._ledger("account", self.ledger.account, tenant.id, user)
        return budget_view(account, tenant)

    async def _lookup(self, model: str | None, candidates: list[int] | None) -> ClassifyResponse:
        if model is None or candidates is None:
            raise classify_forms_error()
        bundle = await asyncio.to_thread(self._bundle_for, model)
        labels = []
        for candidate in candidates:
            try:
                labels.append(label_of(bundle, candidate))
            except InputError as error:
                raise ApiError(400, "invalid_candidate", f"model {model}: {error}") from None
        return ClassifyResponse(model=model, labels=labels)

    def _bundle_for(self, model: str) -> Bundle:
        if model in self.lookups:
            return self.lookups[model]
        try:
            found = bentoml.models.get(model)
        except Exception as error:
            raise ApiError(404, "unknown_model", f"no model version {model!r} here") from error
        if found.tag.name != self.bundle_model.tag.name or found.tag.version is None:
            raise ApiError(404, "unknown_model", f"no model version {model!r} here")
        bundle = Bundle.load(Path(found.path))
        self.lookups[str(found.tag)] = bundle
        return bundle

    async def _privatize(
        self,
        ctx: bentoml.Context,
        user: str,
        epsilon: float,
        documents: list[DocumentIn],
        with_labels: bool,
    ) -> Any:
        tenant = self._tenant(ctx)
        started = time.perf_counter()
        if not math.isfinite(epsilon) or epsilon <= 0:
            raise ApiError(
                400, "invalid_epsilon", f"epsilon must be a finite number above 0, got {epsilon!r}"
            )
        choice = self.bundle.manifest.choice_for(epsilon)
        micro = self._charge(epsilon, tenant, self.slack[choice.variant])
        if len(documents) > self.settings.max_documents:
            raise ApiError(
                413,
                "too_many_documents",
                f"{len(documents)} documents in one request; the limit is "
                f"{self.settings.max_documents}",
            )
        split = [self._sentences(n, doc) for n, doc in enumerate(documents)]
        key = self._idempotency_key(ctx, user, epsilon, documents, with_labels)
        charge = Charge("deepcandidate", micro, len(split), tenant.group_size)
        metric("epsilon").labels(tenant.id).observe(epsilon)
        request_id = uuid.uuid4().hex
        try:
            reserved = await self._ledger(
                "reserve",
                self.ledger.reserve,
                tenant.id,
                user,
                charge,
                tenant.policy,
                request_id,
                key,
            )
        except BudgetExhaustedError as refused:
            metric("refusals").labels(tenant.id).inc()
            raise exhausted_error(refused, tenant) from None
        except IdempotencyInFlightError:
            raise ApiError(
                409,
                "idempotency_key_in_flight",
                "a request with this Idempotency-Key has not finished; retry later",
            ) from None
        except IdempotencyMismatchError:
            raise ApiError(
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was used with a different request body; use a new key",
            ) from None
        if isinstance(reserved, Replay):
            metric("replays").labels(tenant.id).inc()
            ctx.response.headers["Idempotent-Replayed"] = "true"
            return Response(reserved.response, media_type="application/json")
        return await self._run_mechanism(
            ctx, tenant, user, choice, micro, split, reserved, key, with_labels, started
        )

    async def _run_mechanism(
        self,
        ctx: bentoml.Context,
        tenant: Tenant,
        user: str,
        choice: PChoice,
        micro: int,
        split: list[list[str]],
        reserved: Reservation,
        key: IdempotencyKey | None,
        with_labels: bool,
        started: float,
    ) -> Any:
        run_at = epsilon_of_charge(micro)
        items = [
            WorkItem(
                charge_id=cid,
                model=self.version,
                variant=choice.variant,
                sentences=sentences,
                epsilon=run_at,
                p=choice.p,
            )
            for cid, sentences in zip(reserved.charge_ids, split, strict=True)
        ]
        results, reason = await self._call_worker(items)
        final = [i.charge_id for i, r in zip(items, results, strict=True) if r.sampled]
        refund = [i.charge_id for i, r in zip(items, results, strict=True) if not r.sampled]
        if refund:
            metric("refunds").labels(reason or "worker").inc(len(refund))
        account = Account(
            reserved.account.tenant,
            reserved.account.user,
            reserved.account.spent_micro - micro * len(refund),
            reserved.account.documents - len(refund),
            reserved.account.period,
        )
        released = [
            self._document(result, len(sentences), to_epsilon(micro), choice.p, with_labels)
            for result, sentences in zip(results, split, strict=True)
            if result.sampled
        ]
        body: dict[str, Any]
        if refund:
            error = ApiError(
                503,
                "worker_unavailable",
                f"{len(refund)} of {len(items)} documents could not be privatized and were "
                f"refunded ({reason or results[0].error}); retry later",
                released=[d.model_dump() for d in released],
            )
            body = {"error": {"code": error.code, "message": str(error), **error.details}}
            status = 503
        else:
            response = PrivatizeResponse(
                model=self.version, documents=released, budget=budget_view(account, tenant)
            )
            body = response.model_dump(mode="json", exclude_none=True)
            status = 200
        text = json.dumps(body)
        stored = text if final else None  # nothing sampled: free the key for a retry
        try:
            await self._ledger(
                "settle", self.ledger.settle, tenant.id, user, final, refund, key, stored
            )
        except Exception:
            if refund:
                raise ApiError(503, "ledger_unavailable", "the ledger failed; retry") from None
        if final:
            metric("documents").labels(tenant.id).inc(len(final))
            metric("sentences").labels(tenant.id).inc(
                sum(len(s) for s, r in zip(split, results, strict=True) if r.sampled)
            )
        metric("request_seconds").labels("classify" if with_labels else "privatize").observe(
            time.perf_counter() - started
        )
        ctx.response.status_code = status
        return Response(text, status_code=status, media_type="application/json")

    async def _call_worker(self, items: list[WorkItem]) -> tuple[list[WorkResult], str | None]:
        """The worker's results, or all-unsampled results when it certainly did not run.

        Connection refused and 503 (cancelled before dispatch, not ready) mean the mechanism
        did not run: refundable. Anything else (a timeout, a 500, a connection dropped after
        the request was sent) may have come after sampling, so the charges stay final.
        """
        import aiohttp

        def unsampled(reason: str) -> tuple[list[WorkResult], str]:
            return [WorkResult(sampled=False, error=reason) for _ in items], reason

        batched = self.settings.adaptive_batching and (
            sum(len(item.sentences) for item in items) <= self.settings.batch_max_sentences
        )
        endpoint = (
            self.worker.to_async.privatize if batched else self.worker.to_async.privatize_unbatched
        )
        try:
            results = await endpoint(items)
        except aiohttp.ClientConnectorError:
            return unsampled("worker unreachable")
        except bentoml.exceptions.BentoMLException as error:
            if error.error_code == HTTPStatus.SERVICE_UNAVAILABLE:
                return unsampled("worker busy (cancelled before dispatch)")
            raise ApiError(
                500,
                "mechanism_failed",
                "the worker failed after the budget was charged; the charge stands",
            ) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ApiError(
                502,
                "worker_response_lost",
                "the worker's answer was lost after the budget was charged; the charge stands",
            ) from error
        parsed = [r if isinstance(r, WorkResult) else WorkResult.model_validate(r) for r in results]
        return parsed, None

    def _document(
        self, result: WorkResult, k: int, epsilon: float, p: int, with_labels: bool
    ) -> PrivateDocument:
        candidate = int(result.candidate if result.candidate is not None else -1)
        variant, local = self.bundle.locate(candidate)
        document = PrivateDocument(
            embedding=variant.candidates[local].tolist(),
            candidate=candidate,
            variant=variant.record.name,
            k=k,
            epsilon=epsilon,
            p=p,
        )
        if with_labels:
            label = label_of(self.bundle, candidate)
            document.label = label.label
            document.probabilities = label.probabilities
        return document

    def _charge(self, epsilon: float, tenant: Tenant, slack: float) -> int:
        if epsilon <= slack:
            raise ApiError(
                400,
                "invalid_epsilon",
                f"epsilon must be a finite number above {slack:.2g}, got {epsilon!r}",
            )
        if epsilon > tenant.max_epsilon:
            raise ApiError(
                400,
                "invalid_epsilon",
                f"epsilon {epsilon:g} is above this tenant's maximum of {tenant.max_epsilon:g}",
            )
        try:
            return charge_for(epsilon)
        except InputError as error:
            raise ApiError(400, "invalid_epsilon", str(error)) from None

    def _sentences(self, position: int, document: DocumentIn) -> list[str]:
        try:
            if document.sentences is not None:
                return prepare_sentences(document.sentences, self.limits)
            return split_document(document.text or "", self.splitter, self.limits)
        except LimitError as error:
            raise ApiError(413, "document_too_large", f"document {position}: {error}") from None
        except InputError as error:
            raise ApiError(400, "invalid_document", f"document {position}: {error}") from None

    def _idempotency_key(
        self,
        ctx: bentoml.Context,
        user: str,
        epsilon: float,
        documents: list[DocumentIn],
        with_labels: bool,
    ) -> IdempotencyKey | None:
        key = ctx.request.headers.get("idempotency-key")
        if key is None:
            return None
        if not 1 <= len(key) <= MAX_KEY_LENGTH or not key.isprintable():
            raise ApiError(
                400,
                "invalid_idempotency_key",
                f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable characters",
            )
        canonical = json.dumps(
            {
                "endpoint": "classify" if with_labels else "privatize",
                "user": user,
                "epsilon": epsilon,
                "documents": [d.model_dump() for d in documents],
            },
            sort_keys=True,
        ).encode()
        digest = hmac.new(self.secret, canonical, hashlib.sha256).hexdigest()
        return IdempotencyKey(key, digest)

    async def _ledger(self, operation: str, function: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return await asyncio.to_thread(function, *args)
        finally:
            metric("ledger_seconds").labels(operation).observe(time.perf_counter() - started)


def label_of(bundle: Bundle, candidate: int) -> CandidateLabel:
    variant, local = bundle.locate(candidate)
    probs = variant.candidate_class_probs[local]
    labels = bundle.labels
    return CandidateLabel(
        candidate=candidate,
        label=labels[int(probs.argmax())],
        probabilities={name: float(p) for name, p in zip(labels, probs, strict=True)},
    )


def budget_view(account: Account, tenant: Tenant) -> Budget:
    spent = to_epsilon(account.spent_micro)
    limit = to_epsilon(tenant.policy.limit_micro)
    group = tenant.group_size * spent
    remaining = to_epsilon(tenant.policy.limit_micro - tenant.group_size * account.spent_micro)
    return Budget(
        user=account.user,
        spent_epsilon=spent,
        group_size=tenant.group_size,
        group_epsilon=group,
        limit=limit,
        remaining=remaining,
        remaining_epsilon=remaining / tenant.group_size,
        documents=account.documents,
        period=account.period,
    )


def exhausted_error(refused: BudgetExhaustedError, tenant: Tenant) -> ApiError:
    view = budget_view(refused.account, tenant)
    requested = to_epsilon(refused.charge.total_micro)
    return ApiError(
        402,
        "budget_exhausted",
        f"privatizing would spend {requested:g} epsilon, but only "
        f"{view.remaining_epsilon:g} remains for this user (group size {tenant.group_size})",
        requested=requested,
        spent_epsilon=view.spent_epsilon,
        group_size=view.group_size,
        limit=view.limit,
        remaining=view.remaining,
    )


Gateway.add_asgi_middleware(  # type: ignore[attr-defined]
    GuardMiddleware,
    registry_loader=_registry,
    max_body_bytes=_BOOT.max_body_bytes,
    max_json_depth=_BOOT.max_json_depth,
)
