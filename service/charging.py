"""A charged request, top to bottom: validate -> reserve -> run the worker -> settle -> respond.

This is the whole privacy-relevant path of /privatize and /classify, free of any web
framework, so it can be read in one place and tested with a real ledger and a fake worker.

* **validate**: epsilon (finite, above the mechanism's slack, at most the tenant's maximum),
  the number of documents, each document's sentences (split, truncated per sentence, k
  bounded), and the Idempotency-Key. Nothing is written before validation passes.
* **reserve**: one transaction checks the key, debits the whole request if the tenant's policy
  admits it, and records one charge row per document (or finds a stored response to replay).
* **run**: the worker encodes and samples. A :class:`WorkerNotRunError` means no document drew
  randomness; a :class:`WorkerOutcomeUnknownError` means some may have.
* **settle**: sampled documents' charges become final; documents that certainly drew no
  randomness are refunded; the response is stored under the key (or the key released when
  nothing was sampled, so that a retry can run). A failure after the mechanism may have run
  stores its error under the key too: a retry replays it and is not charged again. A charge
  is never refunded after sampling: the refund would depend on the chosen candidate and leak
  it through the budget.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sentdp.accounting import ZCDP, Charge, epsilon_of_charge, to_epsilon
from sentdp.bundle import Bundle, PChoice
from sentdp.labels import vote_slack
from sentdp.mechanism import privacy_slack
from sentdp.text import SentenceSplitter
from service.errors import UNEXPECTED_FAILURE, ApiError, Code, error_code
from service.idempotency import BodySigner
from service.ledger import (
    AccountantChangedError,
    BudgetExhaustedError,
    IdempotencyInFlightError,
    IdempotencyKey,
    IdempotencyMismatchError,
    LedgerError,
    Replay,
    Reservation,
    SqlLedger,
    StoredReplies,
)
from service.logs import log_event, logger
from service.metrics import metric
from service.scheduling import FairExecutor, TenantChecks, TenantLoad, TurnRefusedError, in_turn
from service.schemas import (
    BACKLOG_ERROR,
    CLOSED_ERROR,
    DocumentIn,
    PrivateDocument,
    PrivatizeResponse,
    WorkItem,
    WorkRequest,
    WorkResult,
)
from service.settings import WORKER_CALL_SHARE
from service.tenants import Tenant
from service.validation import (
    Limits,
    charge_of,
    check_cost,
    document_ids,
    finite_epsilon,
    request_sentences,
)
from service.views import (
    backlog_error,
    budget_view,
    exhausted_error,
    private_document,
    refunded_error,
    voted_document,
)

MECHANISM = "deepcandidate"
VOTE_MECHANISM = "sentence-vote"
CHECK_THREADS = 8
"""Threads that check requests (split, tokenize, sign) in a gateway process, shared by all
tenants; each tenant uses at most ``Limits.tenant_checks`` of them at once."""
LEDGER_THREADS = 8
"""Threads for the ledger's calls: a pool of their own, so no other work queues in front of
a reservation or a settlement; tenants take turns, and a tenant holds at most half of them.
One for SQLite, which writes one transaction at a time: more threads only race for its lock,
which its busy handler hands out in no order (``loadtests/ledger_fairness.py``)."""
SETTLE_ATTEMPTS = 2
SETTLE_RETRY_SECONDS = 0.5
"""A settlement that fails is tried once more after this long: a transient failure (a
PostgreSQL restart, a lock held past the busy timeout) then still completes the key, so a
retry of the request replays its reply instead of paying again."""
SETTLE_RETRY_LOCK_SECONDS = 5.0
"""How long the second attempt waits for a row lock (PostgreSQL): after a network drop the
first attempt's server session may live on, holding the user's rows, until TCP keepalive
ends it; the second attempt then gives up instead of holding a ledger thread and the
tenant's load that long."""
HOUSEKEEPING = ("sentdp", "housekeeping")
"""The ledger executor's key for housekeeping calls: a tuple, so no tenant id (a string) is it."""
READ_THREADS = 2
"""Threads for label lookups (free), each tenant one at a time."""
READS_WAITING = 16
"""A tenant's free reads waiting per process beyond the one running; more get 429."""


ROW_TOKENS = 1
"""What one sentence costs beyond its encoding, in padded tokens: recoding it and planning
with it take about a third of the time of encoding one padded token (about 0.05 ms a row,
measured in a review on one busy core, against 0.17 ms a token at 6,000 tokens/s), so this
over-counts."""


def tenant_busy(tenant: str, why: str) -> ApiError:
    """429 ``tenant_busy`` (counted in the tenant's busy metric): refused before any charge,
    because of the tenant's own load; the client may retry after a second."""
    metric("busy").labels(tenant).inc()
    return ApiError(
        Code.TENANT_BUSY,
        f"{why}; retry when earlier requests have finished",
        headers={"Retry-After": "1"},
    )


NOTHING_DRAWN = (
    "the service failed before running the mechanism (logged): nothing was drawn and every "
    "charge of this request was refunded"
)
REFUND_FAILED = (
    "the service failed before running the mechanism (logged), so nothing was drawn, but its "
    "reservation could not be refunded: it may still count against the budget (see /budget); "
    "retry only with the same Idempotency-Key"
)
UNKNOWN_OUTCOME = "the worker failed after the budget was charged; the charge stands"


def work_cost(sentences: Sequence[Sequence[str]], cost: Cost) -> int:
    """A request's work in padded tokens: each distinct sentence encoded once (the worker
    encodes a repeated sentence of a tenant once), plus every sentence's own row of recoding
    and planning, so a request of one sentence repeated a thousand times is not free."""
    rows = [s for document in sentences for s in document]
    return sum(cost(list(dict.fromkeys(rows)))) + ROW_TOKENS * len(rows)


class WorkerNotRunError(Exception):
    """The worker certainly drew no randomness for any item: every charge may be refunded."""


class WorkerOutcomeUnknownError(Exception):
    """The worker may have sampled (a timeout, a 500, a dropped answer): charges stand."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


Cost = Callable[[Sequence[str]], list[int]]
"""Each sentence's encoding cost in padded tokens (:class:`sentdp.encoders.TokenCounter`)."""


def one_per_sentence(sentences: Sequence[str]) -> list[int]:
    return [1] * len(sentences)


Worker = Callable[[WorkRequest], Awaitable[list[WorkResult]]]
"""Runs the mechanism for one request's items; raises the two exceptions above on failure."""


@dataclass(frozen=True)
class ChargedRequest:
    """One authenticated call of /privatize or /classify (documents form)."""

    tenant: Tenant
    user: str
    epsilon: float
    documents: list[DocumentIn]
    caller: bytes = field(repr=False)
    """:func:`~service.idempotency.caller_secret` of the request's API key (never logged)."""
    with_labels: bool = False
    idempotency_key: str | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    arrived: float = field(default_factory=time.time)
    """When the request reached the gateway (Unix seconds): its worker deadline counts from
    here, so time spent waiting to be checked shortens it rather than adding to it."""
    arrived_monotonic: float = field(default_factory=time.monotonic)
    """The same moment on this process's monotonic clock, for measuring waits here (a step
    of the wall clock must not make a request look late)."""

    @property
    def endpoint(self) -> str:
        return "classify" if self.with_labels else "privatize"


@dataclass(frozen=True)
class Reply:
    """What to send back: a status, a JSON body (already serialised) and extra headers."""

    status: int
    body: str
    replayed: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    code: str | None = None
    """The error code of an error reply (for the request log), else None."""

    @classmethod
    def of(cls, error: ApiError) -> Reply:
        """The reply of a refusal."""
        return cls(error.status, error.json(), headers=error.headers, code=error.code.value)


@dataclass(frozen=True)
class Admission:
    """What validation decided for a request, before anything is written."""

    choice: PChoice
    micro: int
    sentences: list[list[str]]
    key: IdempotencyKey | None
    cost: int
    """Padded tokens the worker will encode: what the request weighs against its tenant."""
    document_ids: tuple[str, ...] = ()
    release: Literal["candidate", "vote"] = "candidate"
    """What the worker draws: /classify at an epsilon whose label comes from SentenceVote
    draws the vote (the label alone); everything else draws a DeepCandidate candidate."""

    @property
    def charge(self) -> Charge:
        mechanism = VOTE_MECHANISM if self.release == "vote" else MECHANISM
        return Charge(mechanism, self.micro, len(self.sentences), self.document_ids)


class Charging:
    """The charged-request flow over one bundle, one ledger and one worker."""

    def __init__(
        self,
        bundle: Bundle,
        version: str,
        ledger: SqlLedger,
        worker: Worker,
        limits: Limits,
        signer: BodySigner,
        cost: Cost = one_per_sentence,
    ) -> None:
        self.bundle = bundle
        self.version = version
        self.ledger = ledger
        self.worker = worker
        self.limits = limits
        self.signer = signer
        self.cost = cost
        self.load = TenantLoad(limits.tenant_inflight_tokens, limits.tenant_inflight_requests)
        self.checks = TenantChecks(limits.tenant_checks, limits.tenant_checks_waiting)
        # Each kind of work on threads of its own: a queue of one kind (a tenant's checks, its
        # free reads) never holds another tenant's reservations back.
        self._checkers = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="sentdp-check")
        threads = LEDGER_THREADS if ledger.parallel_writes else 1
        self._ledger_calls = FairExecutor(threads, "sentdp-ledger", per_key=max(1, threads // 2))
        self.reads = TenantChecks(1, READS_WAITING)
        self._settling: set[asyncio.Task[Reply]] = set()  # the loop holds tasks weakly
        self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="sentdp-read")
        self.splitter = SentenceSplitter()
        self.slack = {v.record.name: privacy_slack(v.record.candidates) for v in bundle.variants}
        self.vote_slack = 0.0 if bundle.vote is None else vote_slack(bundle.vote.classes)
        self.worker_closed = False
        """A worker process answered that it refuses to serve (its encoder failed a later
        batch-invariance check): the gateway says not ready from then on. Its own probe of
        the worker reaches one of several worker processes, not necessarily that one."""

    async def handle(self, request: ChargedRequest) -> Reply:
        """Run one request to its reply; every refusal becomes an error reply."""
        started = time.perf_counter()
        try:
            admission = await self._checked(request)
            reply = await self._admitted(request, admission)
        except ApiError as error:
            reply = Reply.of(error)
        except Exception:  # a bug: said as one, never as the caller's error
            logger.exception("request %s failed", request.request_id)
            reply = Reply.of(ApiError(Code.INTERNAL_ERROR, UNEXPECTED_FAILURE))
        seconds = time.perf_counter() - started
        metric("request_seconds").labels(request.endpoint).observe(seconds)
        log_event(
            "charged_request",
            request_id=request.request_id,
            tenant=request.tenant.id,
            endpoint=request.endpoint,
            documents=len(request.documents),
            status=reply.status,
            code=reply.code,
            replayed=reply.replayed,
            seconds=round(seconds, 4),
        )
        return reply

    async def _checked(self, request: ChargedRequest) -> Admission:
        """:meth:`validate` on the checking threads, within the tenant's share of them (429
        when its queue is full, before any work)."""
        tenant = request.tenant.id

        def in_time() -> None:  # a request that waited this long could not reach the worker
            waited = time.monotonic() - request.arrived_monotonic
            if waited > self.limits.start_timeout:
                raise tenant_busy(
                    tenant,
                    f"this request waited {waited:.0f} s behind this tenant's own "
                    "requests to be checked",
                )

        admission: Admission = await self._in_turn(
            self.checks,
            self._checkers,
            tenant,
            lambda: (
                f"this tenant has {self.checks.in_queue(tenant)} requests waiting to be checked"
            ),
            in_time,
            self.validate,
            request,
        )
        return admission

    @staticmethod
    async def _in_turn(
        gate: TenantChecks,
        pool: Executor,
        tenant: str,
        busy: Callable[[], str],
        on_turn: Callable[[], None],
        function: Callable[..., Any],
        *args: Any,
    ) -> Any:
        """:func:`~service.scheduling.in_turn`, refusing with 429 ``busy()`` when the
        tenant's queue at ``gate`` is full."""
        try:
            return await in_turn(gate, pool, tenant, on_turn, function, *args)
        except TurnRefusedError:
            raise tenant_busy(tenant, busy()) from None

    async def _admitted(self, request: ChargedRequest, admission: Admission) -> Reply:
        """Reserve, run and settle while the request counts against its tenant's load.

        Once reserved, the work runs to its settlement even if the request is cancelled (the
        gateway's request timeout, a shutdown; a client that disconnects does not cancel it):
        what was sampled is charged and its reply stored under the key, what was not is
        refunded, and the tenant's load is given back only when the work has ended, so a
        cancelled request never lets a tenant exceed it."""
        tenant = request.tenant.id
        if not self.load.try_acquire(tenant, admission.cost):
            raise tenant_busy(
                tenant, f"this tenant may have {self.load.limit} padded tokens of work in flight"
            )
        running: asyncio.Task[Reply] | None = None
        try:
            reserved = await self.reserve(request, admission)
            if isinstance(reserved, Replay):
                metric("replays").labels(tenant).inc()
                code = error_code(reserved.response) if reserved.status >= 400 else None
                return Reply(reserved.status, reserved.response, replayed=True, code=code)
            # Without its documents' raw text: the guard stops counting the body's bytes
            # when the request ends, and what the work still holds (its sentences) is bounded
            # by the tenant's load.
            slim = replace(request, documents=[])
            running = asyncio.get_running_loop().create_task(
                self.run_and_settle(slim, admission, reserved), name=request.request_id
            )
            self._settling.add(running)
            running.add_done_callback(self._settling.discard)
            running.add_done_callback(lambda _: self.load.release(tenant, admission.cost))
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                documents = len(request.documents)
                running.add_done_callback(
                    lambda ran: self._ended_after_cancel(slim, documents, ran)
                )
                raise
        finally:
            if running is None:
                self.load.release(tenant, admission.cost)

    @staticmethod
    def _ended_after_cancel(
        request: ChargedRequest, documents: int, ran: asyncio.Future[Reply]
    ) -> None:
        """A reserved request's work ended after the request was cancelled: log how (the
        reply is stored under its key, if any; no one else will see it)."""
        error = None if ran.cancelled() else ran.exception()  # marks any error as seen
        status: int | None = None
        if ran.cancelled():
            outcome = "cancelled"  # a shutdown: the charges stay reserved, which counts them
        elif error is None:  # a settlement that failed was logged ("ledger settle failed")
            outcome, status = "answered", ran.result().status
        else:  # an ApiError, whose stored reply says what was charged, or a bug
            outcome = "failed"
            status = error.status if isinstance(error, ApiError) else None
            if not isinstance(error, ApiError):
                logger.error(
                    "request %s failed after its cancel", request.request_id, exc_info=error
                )
        log_event(
            "charged_request_ended_after_cancel",
            logging.INFO if outcome == "answered" else logging.WARNING,
            request_id=request.request_id,
            tenant=request.tenant.id,
            endpoint=request.endpoint,
            documents=documents,
            outcome=outcome,
            status=status,
            error=None if error is None else type(error).__name__,
            seconds=round(time.monotonic() - request.arrived_monotonic, 4),
        )

    async def drain(self, seconds: float) -> int:
        """Wait up to ``seconds`` for reserved work still running (requests cancelled while
        the worker ran), so a stopping server settles it; how many did not end in time
        (cancelled with the event loop: their charges stay reserved, which counts them)."""
        running = [task for task in self._settling if not task.done()]
        if not running:
            return 0
        _, left = await asyncio.wait(running, timeout=seconds)
        if left:  # the tasks are named by request id: whose charges to reconcile
            ids = sorted(task.get_name() for task in left)
            log_event("charged_work_left_at_shutdown", logging.WARNING, request_ids=ids)
        return len(left)

    async def housekeep(self) -> int:
        """Purge expired idempotency rows if this process's minute has passed, and remove
        purged rows' bytes from the ledger's files (:meth:`~service.ledger.sql.SqlLedger.
        housekeep`), on the ledger's threads in a turn of its own among the tenants' calls;
        how many rows went."""
        purged: int = await asyncio.wrap_future(
            self._ledger_calls.submit(HOUSEKEEPING, self.ledger.housekeep)
        )
        return purged

    # --- validate ------------------------------------------------------------------------
    def validate(self, request: ChargedRequest) -> Admission:
        """Check everything about the request that needs no database; raise ApiError."""
        choice = self.bundle.manifest.choice_for(finite_epsilon(request.epsilon))
        release: Literal["candidate", "vote"] = (
            "vote" if request.with_labels and choice.label == "vote" else "candidate"
        )
        # Refused here, not in the worker: the epsilon must clear the slack of what is drawn.
        slack = self.vote_slack if release == "vote" else self.slack[choice.variant]
        micro = charge_of(request.epsilon, request.tenant.max_epsilon, slack)
        sentences = request_sentences(request.documents, self.splitter, self.limits)
        key = self.signer.key(
            request.idempotency_key,
            request.tenant.id,
            request.endpoint,
            request.user,
            request.epsilon,
            request.documents,
            request.caller,
        )
        ids = document_ids(request.documents, request.tenant.composition)
        tokens = check_cost(work_cost(sentences, self.cost), self.limits)
        return Admission(choice, micro, sentences, key, tokens, ids, release)

    # --- reserve -------------------------------------------------------------------------
    async def reserve(self, request: ChargedRequest, admission: Admission) -> Reservation | Replay:
        """The atomic check-and-debit (with the key); refusals become ApiErrors."""
        tenant = request.tenant
        metric("epsilon").labels(tenant.id).observe(request.epsilon)
        try:
            reserved: Reservation | Replay = await self._ledger(
                "reserve",
                request,
                self.ledger.reserve,
                tenant.id,
                request.user,
                admission.charge,
                tenant.policy,
                request.request_id,
                admission.key,
                abandoned=lambda reserved: self._refund_abandoned(request, admission, reserved),
            )
            return reserved
        except BudgetExhaustedError as refused:
            metric("refusals").labels(tenant.id).inc()
            raise exhausted_error(refused) from None
        except IdempotencyInFlightError:
            raise ApiError(
                Code.IDEMPOTENCY_KEY_IN_FLIGHT,
                "a request with this Idempotency-Key has not finished; retry later",
            ) from None
        except AccountantChangedError as changed:
            raise ApiError(
                Code.ACCOUNTANT_CHANGED,
                f"this user's current period was accounted {changed.kept_by} and the tenant "
                f"now accounts {changed.wanted}: the operator must open a new period "
                "(sentdp-admin new-period) before more is charged",
            ) from None
        except IdempotencyMismatchError:
            raise ApiError(
                Code.IDEMPOTENCY_KEY_REUSED,
                "this Idempotency-Key was used with a different request (another endpoint or "
                "body, or another API key): a retry must repeat its first attempt exactly, under "
                "the same API key; with a new Idempotency-Key it is a new request, charged again",
            ) from None
        except Exception:
            logger.exception("ledger reserve failed (request %s)", request.request_id)
            raise ApiError(
                Code.LEDGER_UNAVAILABLE,
                # a connection lost during COMMIT may have committed: the charge may count
                "the ledger is unavailable and the request did not run; if the ledger failed "
                "while recording the charge it may still count, so retry with the same "
                "Idempotency-Key",
            ) from None

    # --- run and settle ------------------------------------------------------------------
    async def run_and_settle(
        self, request: ChargedRequest, admission: Admission, reserved: Reservation
    ) -> Reply:
        """Run the mechanism for the reserved documents and settle every charge. A zCDP
        tenant is charged epsilon**2 / 8 per release, which holds for epsilon-bounded-range
        mechanisms only: its votes are drawn by the exponential mechanism (DeepCandidate's
        candidates always are)."""
        try:
            work = self._work(request, admission, reserved)
        except Exception:
            # The worker was never called, so nothing was drawn: every charge is refunded and
            # the key freed, as for a request the worker refused.
            logger.exception("building the work failed (request %s)", request.request_id)
            if await self._settle(request, admission, [], reserved.charge_ids, None):
                raise ApiError(Code.INTERNAL_ERROR, NOTHING_DRAWN, charged=False) from None
            raise ApiError(Code.INTERNAL_ERROR, REFUND_FAILED) from None
        items = work.items
        try:
            results = await self._run(request, work)
        except Exception as failure:
            # Some documents may have sampled: every charge is final, and the error is stored
            # under the key, so a retry with the same key replays it instead of charging again.
            if isinstance(failure, WorkerOutcomeUnknownError):
                error = ApiError(failure.code, str(failure))
            else:  # a bug after the worker call was made
                logger.exception("after the worker call (request %s)", request.request_id)
                error = ApiError(Code.MECHANISM_FAILED, UNKNOWN_OUTCOME)
            await self._settle(request, admission, reserved.charge_ids, [], Reply.of(error))
            raise error from None
        final, refund = list(reserved.charge_ids), []  # until the results are read: all stand
        try:
            final = [i.charge_id for i, r in zip(items, results, strict=True) if r.sampled]
            refund = [i.charge_id for i, r in zip(items, results, strict=True) if not r.sampled]
            reply = self._reply(request, admission, reserved, results)
        except Exception:
            # A result this gateway cannot read (a bug, or a worker of another version): what
            # was drawn stays charged, and the failure is stored under the key like any other
            # failure after sampling, so a retry replays it instead of drawing again.
            logger.exception("reading the worker's results failed (request %s)", request.request_id)
            error = ApiError(
                Code.MECHANISM_FAILED,
                "the service could not read the mechanism's result; the charge stands",
            )
            await self._settle(request, admission, final, refund, Reply.of(error))
            raise error from None
        stored = reply if final else None  # nothing sampled: free the key for a retry
        await self._settle(request, admission, final, refund, stored)  # failure: still counted
        if final:
            metric("documents").labels(request.tenant.id).inc(len(final))
            metric("sentences").labels(request.tenant.id).inc(
                sum(len(s) for s, r in zip(admission.sentences, results, strict=True) if r.sampled)
            )
        return reply

    def _work(
        self, request: ChargedRequest, admission: Admission, reserved: Reservation
    ) -> WorkRequest:
        """The worker's request: one item per reserved charge."""
        bounded = admission.release == "vote" and request.tenant.policy.accounting == ZCDP
        items = [
            WorkItem(
                charge_id=charge_id,
                model=self.version,
                variant=admission.choice.variant,
                sentences=sentences,
                epsilon=epsilon_of_charge(admission.micro),
                p=admission.choice.p,
                selection=admission.choice.selection,
                radius=admission.choice.radius,
                release=admission.release,
                vote=admission.choice.vote_index,
                vote_table=admission.choice.vote_table,
                bounded_range=bounded,
            )
            for charge_id, sentences in zip(reserved.charge_ids, admission.sentences, strict=True)
        ]
        return WorkRequest(
            request_id=request.request_id,
            tenant=request.tenant.id,
            deadline=request.arrived + self.limits.start_timeout,
            cost=admission.cost,
            items=items,
        )

    async def _run(self, request: ChargedRequest, work: WorkRequest) -> list[WorkResult]:
        started = time.perf_counter()
        items = work.items
        # A call still running when the key's pending window ends could see a retry take the
        # key over and sample again: it ends first (the window counts from the reservation,
        # after the arrival), as an unknown outcome (charged). Counted on the monotonic
        # clock, so a step of the wall clock cannot stretch it past the window.
        given_up = request.arrived_monotonic + self.ledger.pending_timeout * WORKER_CALL_SHARE
        try:
            async with asyncio.timeout(max(0.0, given_up - time.monotonic())):
                results = await self.worker(work)
        except TimeoutError as late:
            logger.error("worker call given up (request %s)", request.request_id)
            raise WorkerOutcomeUnknownError(
                Code.WORKER_RESPONSE_LOST,
                "the worker's answer did not come in time after the budget was charged; "
                "the charge stands",
            ) from late
        except WorkerNotRunError as not_run:
            logger.warning(
                "worker did not run (request %s): %s", request.request_id, not_run, exc_info=True
            )
            results = [WorkResult(sampled=False, error=str(not_run)) for _ in items]
        except WorkerOutcomeUnknownError:
            logger.exception("worker failed after the charge (request %s)", request.request_id)
            raise
        except Exception as error:  # anything else may also have come after sampling
            logger.exception("worker call failed (request %s)", request.request_id)
            raise WorkerOutcomeUnknownError(Code.MECHANISM_FAILED, UNKNOWN_OUTCOME) from error
        finally:
            metric("worker_call_seconds").observe(time.perf_counter() - started)
        if len(results) != len(items):
            logger.error("worker answered %d results for %d items", len(results), len(items))
            raise WorkerOutcomeUnknownError(Code.MECHANISM_FAILED, UNKNOWN_OUTCOME)
        refunded = [r for r in results if not r.sampled]
        if refunded:
            metric("refunds").labels(refunded[0].error or "worker").inc(len(refunded))
        if not self.worker_closed and any(r.error == CLOSED_ERROR for r in refunded):
            self.worker_closed = True
            log_event("gateway_not_ready_worker_refusing", logging.ERROR)
        return results

    def _reply(
        self,
        request: ChargedRequest,
        admission: Admission,
        reserved: Reservation,
        results: list[WorkResult],
    ) -> Reply:
        released = [
            self._released(request, admission, result, len(sentences))
            for result, sentences in zip(results, admission.sentences, strict=True)
            if result.sampled
        ]
        if len(released) < len(results):
            if not released and all(r.error == BACKLOG_ERROR for r in results):
                metric("busy").labels(request.tenant.id).inc()
                error = backlog_error(len(results))
                return Reply.of(error)
            reason = next(r.error for r in results if not r.sampled) or "worker"
            error = refunded_error(released, len(results), reason)
            return Reply.of(error)
        budget = budget_view(reserved.account, request.tenant.policy)
        response = PrivatizeResponse(model=self.version, documents=released, budget=budget)
        return Reply(200, json.dumps(response.model_dump(mode="json", exclude_none=True)))

    def _released(
        self, request: ChargedRequest, admission: Admission, result: WorkResult, k: int
    ) -> PrivateDocument:
        epsilon = to_epsilon(admission.micro)
        if admission.release == "vote":
            return voted_document(
                self.bundle, int(result.label if result.label is not None else -1), k, epsilon
            )
        candidate = int(result.candidate if result.candidate is not None else -1)
        return private_document(
            self.bundle, candidate, k, epsilon, admission.choice, request.with_labels
        )

    async def _settle(
        self,
        request: ChargedRequest,
        admission: Admission,
        final: list[int],
        refund: list[int],
        stored: Reply | None,
    ) -> bool:
        """Settle in the ledger, a second time :data:`SETTLE_RETRY_SECONDS` after a failure
        (the ledger replaces a connection it lost); False (logged) when both failed: the
        charges then stay ``reserved``, which still counts them (an over-charge, never an
        under-charge). Settling twice is safe: only charges still ``reserved`` move, and a
        reply is stored only on a key still pending."""
        for attempt in range(1, SETTLE_ATTEMPTS + 1):
            try:
                await self._ledger(
                    "settle",
                    request,
                    self.ledger.settle,
                    request.tenant.id,
                    request.user,
                    final,
                    refund,
                    admission.key,
                    stored.body if stored else None,
                    stored.status if stored else 200,
                    request.request_id,
                    self._kept_replies(),
                    None if attempt == 1 else SETTLE_RETRY_LOCK_SECONDS,
                    must_run=True,
                )
            except Exception:
                if attempt == SETTLE_ATTEMPTS:
                    logger.exception("ledger settle failed (request %s)", request.request_id)
                    return False
                logger.warning(
                    "ledger settle failed; trying again (request %s)",
                    request.request_id,
                    exc_info=True,
                )
                await asyncio.sleep(SETTLE_RETRY_SECONDS)
                continue
            return True
        return False

    def _kept_replies(self) -> StoredReplies | None:
        """The bound on a tenant's stored replies, and the stand-in kept past it."""
        limit = self.limits.tenant_stored_reply_bytes
        if limit is None:
            return None
        stand_in = ApiError(
            Code.REPLY_NOT_KEPT,
            "this request ran and whatever it charged stands (see /budget), but its reply was "
            f"not kept for retries: the tenant's stored replies reached their limit ({limit} "
            "bytes, SENTDP_TENANT_STORED_REPLY_BYTES; each is kept 24 hours)",
        )
        return StoredReplies(limit, stand_in.json(), stand_in.status)

    async def _ledger(
        self,
        operation: str,
        request: ChargedRequest,
        function: Callable[..., Any],
        *args: Any,
        must_run: bool = False,
        abandoned: Callable[[Any], None] | None = None,
    ) -> Any:
        """A ledger call for ``request`` on the ledger's threads (database calls never block
        the event loop), in its tenant's turn among tenants with calls waiting.

        If the request is cancelled (the gateway's timeout, a shutdown) while the call waits,
        the call is dropped, unless it ``must_run`` (a settlement after the worker ran:
        dropped, it would leave its charges reserved and its key pending). A call that runs
        although its request is gone is still logged if it fails, and ``abandoned`` gets its
        result."""
        started = time.perf_counter()
        call = contextvars.copy_context().run
        future = self._ledger_calls.submit(request.tenant.id, call, function, *args)
        done = asyncio.wrap_future(future)
        try:
            return await (asyncio.shield(done) if must_run else done)
        except asyncio.CancelledError:
            if not future.cancelled():  # it runs, or ran, with no one waiting for it
                done.add_done_callback(lambda d: d.cancelled() or d.exception())  # seen below
                future.add_done_callback(
                    lambda f: self._ended_unawaited(operation, request, f, abandoned)
                )
            raise
        finally:
            metric("ledger_seconds").labels(operation).observe(time.perf_counter() - started)

    @staticmethod
    def _ended_unawaited(
        operation: str,
        request: ChargedRequest,
        future: Future[Any],
        abandoned: Callable[[Any], None] | None,
    ) -> None:
        """A ledger call ended after its request was cancelled: log a failure, or hand its
        result to ``abandoned``."""
        error = future.exception()
        if isinstance(error, LedgerError):  # a refusal (budget, key): nothing to repair
            logger.info(
                "ledger %s refused after its request was cancelled (request %s): %s",
                operation,
                request.request_id,
                type(error).__name__,
            )
        elif error is not None:
            logger.error(
                "ledger %s failed after its request was cancelled (request %s)",
                operation,
                request.request_id,
                exc_info=error,
            )
        elif abandoned is not None:
            try:
                abandoned(future.result())
            except Exception:
                logger.exception(
                    "repairing a cancelled request's ledger %s failed (request %s)",
                    operation,
                    request.request_id,
                )

    def _refund_abandoned(
        self, request: ChargedRequest, admission: Admission, reserved: Reservation | Replay
    ) -> None:
        """A reservation ended after its request was cancelled: the worker never ran for it,
        so refund its charges and release its key (a retry then runs afresh)."""
        if not isinstance(reserved, Reservation):
            return  # a replay charged nothing

        def refund() -> None:
            self.ledger.settle(
                request.tenant.id,
                request.user,
                [],
                reserved.charge_ids,
                admission.key,
                None,
                200,
                request.request_id,
            )

        refunding = self._ledger_calls.submit(request.tenant.id, refund)
        refunding.add_done_callback(
            lambda f: self._ended_unawaited("refund", request, f, abandoned=None)
        )

    async def read(
        self, tenant: str, function: Callable[..., Any], *args: Any, ledger: bool = False
    ) -> Any:
        """A free read for ``tenant`` (a label lookup; with ``ledger``, its users' budgets, on
        the ledger's threads) one of the tenant's at a time: a tenant's flood of reads waits
        behind itself, not in front of other tenants' requests; 429 ``tenant_busy`` past
        :data:`READS_WAITING` waiting. Lookups have threads of their own, so a slow one (a
        bundle loading) holds up no budget read."""
        return await self._in_turn(
            self.reads,
            self._ledger_calls.for_key(tenant) if ledger else self._readers,
            tenant,
            lambda: f"this tenant has {self.reads.in_queue(tenant)} reads waiting to run",
            lambda: None,
            function,
            *args,
        )
