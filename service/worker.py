"""The batched worker: encodes sentences and runs DeepCandidate (or, for /classify at an
epsilon whose label comes from it, SentenceVote) for a whole adaptive batch.

A batch holds whole requests (:class:`~service.schemas.WorkRequest`) of different users, k,
epsilon and p; BentoML never splits one. One computation runs at a time, tenants taking turns
(:mod:`service.scheduling`); a request whose deadline passed before its turn draws nothing.
Everything that can fail runs before any randomness is drawn (encoding, recoding, validation,
selection plans), and an item whose preparation fails answers ``sampled=False`` alone, which
lets the gateway refund it. After the plans are built, each item's charge id is appended to
the optional sample journal, then the random words are drawn: from that point the charges are
final whatever happens.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import bentoml
import numpy as np
from bentoml.validators import ContentType

from sentdp.errors import InputError
from sentdp.mean_selection import MeanCandidate
from sentdp.mechanism import DeepCandidate
from service import logs
from service.invariance import LaterChecks, NoInvariantModeError, StartUpCheck, invariant_encoder
from service.metrics import metric
from service.scheduling import BATCH_KEY, ComputeThread, FairGate
from service.schemas import (
    BACKLOG_ERROR,
    CLOSED_ERROR,
    LATE_ERROR,
    WorkItem,
    WorkReply,
    WorkRequest,
    WorkResult,
)
from service.settings import ACCESS_LOG, ServiceSettings, boot_settings, load_settings

if TYPE_CHECKING:
    from sentdp.bundle import Bundle

BOOT = boot_settings()
LATE = WorkResult(sampled=False, error=LATE_ERROR)
"""The answer for an item whose request's deadline passed before its turn (nothing drawn)."""
BACKLOG = WorkResult(sampled=False, error=BACKLOG_ERROR)
"""The same, for a tenant's own large request that waited behind the tenant's earlier ones."""
CLOSED = WorkResult(sampled=False, error=CLOSED_ERROR)
"""The answer for every item once no encoder mode passes a later bucket check (nothing drawn)."""
MODE_CHOICES = 3
"""How often a worker chooses its mode again after a later bucket check moved a probe,
before it refuses to serve (each choice checks every bucket, so one should do)."""
CHECK_ATTEMPTS = 2
"""How often a later bucket check that raises is run before the worker refuses to serve."""
LATER_KEY = ("bucket-checks",)
"""The gate key of the checks of the buckets the start-up probes miss (a tuple: no tenant id,
whatever the operator names it, can share it)."""
REPLIES = Annotated[list[WorkReply], ContentType("application/json")]
"""The worker's answer type. The media type is stated because BentoML otherwise derives it
from the list's JSON schema on every response (a third of the worker event loop's busy
samples under load, profiled)."""
WORKER_CALLERS = 64
"""Threads that may wait inside the worker at once: BentoML's default of one would queue
calls first come, first served before they reach the gate that lets tenants take turns."""


class StartPhases:
    """Seconds of each phase of a worker's start, for its log (``worker_start_phases``): where
    a cold start goes, without a profiler."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def end(self, phase: str) -> None:
        """``phase`` ended now: it took the time since the previous one ended."""
        now = time.perf_counter()
        self.seconds[phase] = round(now - self._last, 3)
        self._last = now


class MemoryTrim:
    """Hands the heap's free pages back to the system after a computation, at most once per
    ``interval`` seconds. Batches run on whichever of the worker's threads holds the gate,
    and glibc gives each thread its own arena, which keeps a batch's activations after they
    are freed; without this the worker's resident memory grows by about one batch per arena
    used (measured with torch at concurrency 32 on BBC News: the worker held 790 MiB at the
    end of a run instead of 655, and the whole server peaked at 1,053 MiB instead of 1,013;
    throughput unchanged). A return walks the whole heap (16-19 ms in the worker with ONNX
    Runtime int8), so it is not repeated for every lone document; a batch of at least
    :data:`LARGE_BATCH_SENTENCES` returns its pages whenever it ends (it took far longer
    than the return), so an idle worker does not keep a large batch's activations."""

    LARGE_BATCH_SENTENCES = 1024

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last = -float("inf")
        self._lock = threading.Lock()

    def __call__(self, sentences: int = 0) -> bool:
        """Return freed pages if ``interval`` has passed since the last time, or after a batch
        of at least :data:`LARGE_BATCH_SENTENCES`; whether it did."""
        if _MALLOC_TRIM is None:
            return False
        with self._lock:
            now = self._clock()
            if now - self._last < self.interval and sentences < self.LARGE_BATCH_SENTENCES:
                return False
            self._last = now
        with contextlib.suppress(OSError):  # returning memory is an optimisation, never an error
            _MALLOC_TRIM(0)
        return True


def _glibc_malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library is not glibc (musl, macOS)."""
    import ctypes

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _glibc_malloc_trim()


def _resources() -> dict[str, Any]:
    return {"gpu": BOOT.worker_gpus} if BOOT.worker_gpus else {}


CLOSED_MARKER = "sentdp-worker-closed"


def closed_marker() -> Path | None:
    """The file a worker process that refuses to serve leaves for the server's other worker
    processes, whose /readyz then says not ready too, until the server is launched again:
    in BentoML's metrics folder (``PROMETHEUS_MULTIPROC_DIR``, which ``bentoml serve`` sets
    for every process of the server and empties at each launch); None in a process it did
    not start (in-process use shares no folder)."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(folder) / CLOSED_MARKER if folder else None


@bentoml.service(
    name="sentdp-worker",
    workers=BOOT.worker_count(),
    threads=WORKER_CALLERS,
    logging=ACCESS_LOG,
    resources=_resources(),
    traffic={"timeout": BOOT.worker_max_latency_ms / 1000 * 2},
)
class Worker:
    bundle_model = bentoml.models.BentoModel(BOOT.model)

    def __init__(self) -> None:
        logs.configure()
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts
        from sentdp.bundle import Bundle

        settings = load_settings()
        stored = self.bundle_model
        self.version = str(stored.tag)
        self.phases = StartPhases()
        self.bundle = Bundle.load(Path(stored.path))
        self.phases.end("bundle")
        self.bundle.check_encoder(settings.encoder_backend)
        self.variants = {v.record.name: v for v in self.bundle.variants}
        self.journal = settings.sample_journal
        self.fault_marker = FAULT_MARKER
        self.trim_memory = MemoryTrim(settings.memory_trim_interval_s)
        if self.fault_marker:
            logs.log_event("fault_marker_set_tests_only", logging.WARNING)
        self.gate = FairGate()
        self.compute = ComputeThread()  # torch's start-up and every computation: one team
        self.closed = False
        """No encoder mode passed a bucket's check after start-up: every item is refused."""
        self.closed_marker = closed_marker()
        self.rechoices = 0
        try:
            self.compute.run(self._open_encoder, settings)
        except InputError as problem:  # a setting or the bundle; exception messages are redacted
            logs.log_event("refusing_to_start", logging.ERROR, reason=str(problem))
            raise
        logs.log_event("worker_start_phases", logging.INFO, **self.phases.seconds)
        checks = threading.Thread(target=self._check_buckets, name="sentdp-bucket-checks")
        checks.daemon = True
        checks.start()

    def __is_ready__(self) -> bool:
        """Ready once every bucket has passed its check, and never again once the worker
        refuses to serve (the gateway's /readyz follows). A batch that arrives before (from a
        client that does not wait for /readyz) waits inside the worker for the checks, and
        BentoML's batching dispatcher, which learns batch times from such calls, then
        cancelled queued calls (measured: 72 of 200 requests refused, 503, right after a
        start). Not ready either once another worker process of the server refuses to serve
        (:func:`closed_marker`): the gateway's probe reaches one worker process, so with
        several the server's /readyz would otherwise answer both ways."""
        if self.closed or self.later.pending():
            return False
        return self.closed_marker is None or not self.closed_marker.exists()

    def _open_encoder(self, settings: ServiceSettings) -> None:
        """Load G, check that batching cannot move an embedding, build the mechanisms (on
        CUDA their depth runs in torch) and warm up; on the compute thread."""
        from sentdp.encoders import open_encoder, pick_device

        device = settings.device or "cpu"
        threads = settings.encoder_threads()
        if self.bundle.encoder_backend == "torch":  # ONNX bundles never import torch
            import torch

            torch.set_num_threads(threads)
            device = pick_device(settings.device)
            self.phases.end("torch_start")
        self.device = device
        self.encoder = open_encoder(
            self.bundle.encoder_dir,
            self.bundle.encoder_backend,
            device,
            settings.encoder_rows(device),
            threads=threads,
            spin_between_runs=settings.encoder_spin_between_runs,
            onnx_threading=settings.encoder_threading,
            cpu_linear=settings.cpu_linear,
        )
        self.bundle.check_opened_encoder(self.encoder)
        self.phases.end("encoder_open")
        self.encoder_mode = self._batch_invariant_encoder(settings.check_every_bucket)
        self.phases.end("start_up_check")
        self._build_mechanisms()
        self.means = mean_mechanisms(self.bundle, settings.max_sentences)
        self.phases.end("mechanisms")
        self.encoder.encode(["Warm up the encoder."])
        self.phases.end("warm_up")

    # Routes under /worker/: BentoML's request metrics of the worker and the gateway share
    # one /metrics, and the gateway's public /privatize must not be counted with these.
    @bentoml.api(
        route="/worker/privatize",
        batchable=True,
        max_batch_size=BOOT.worker_batch_size,
        max_latency_ms=BOOT.worker_max_latency_ms,
    )
    def privatize(self, requests: list[WorkRequest]) -> REPLIES:
        """Adaptive-batched: whole requests of many tenants are merged into one call."""
        return self._run(requests, BATCH_KEY)

    @bentoml.api(route="/worker/privatize_unbatched")
    def privatize_unbatched(self, requests: list[WorkRequest]) -> REPLIES:
        """The same work without adaptive batching: one large request, in its tenant's turn."""
        # A tuple: no tenant id, whatever the operator names it, can share the batches' key.
        tenants = {r.tenant for r in requests}
        key = ("tenant", *tenants) if len(tenants) == 1 else BATCH_KEY
        return self._run(requests, key)

    def _build_mechanisms(self) -> None:
        """DeepCandidate per variant, its depth in torch on the encoder's CUDA device (NumPy
        on the CPU): again whenever the encoder's mode is chosen again."""
        cuda = self.encoder.device.startswith("cuda")
        self.mechanisms = {
            name: v.mechanism(device=self.encoder.device if cuda else None)
            for name, v in self.variants.items()
        }

    def _batch_invariant_encoder(self, every_bucket: bool, rejected: bool = False) -> str:
        """Serve in a mode where batching cannot move an embedding (:mod:`service.invariance`:
        the encoder as opened unless ``rejected``, else fixed-shape batches, else for CUDA
        the CPU), with the buckets the check's probes missed left to :attr:`later`; the
        mode."""
        from sentdp.encoders import use_deterministic_kernels

        settings = load_settings()
        check = StartUpCheck(every_bucket, "later" if rejected else "start-up")
        self.encoder, mode = invariant_encoder(
            self.encoder,
            self._reopen,
            check,
            settings.cuda_graphs,
            use_deterministic_kernels,
            rejected,
            self.device,
        )
        self.later = LaterChecks(self.encoder, check.buckets, "later")
        level, fields = check.report(self.encoder.max_tokens, self.later.pending())
        logs.log_event("encoder_buckets_checked", level, **fields)
        return mode

    def _check_buckets(self) -> None:
        """Check the buckets left to :attr:`later`, smallest first, one per turn at the gate,
        until none is left or the worker refuses to serve (its own thread)."""
        while not self.closed and (pending := self.later.pending()):
            with self.gate.turn(LATER_KEY):
                self.compute.run(self._check_later, pending[0])

    def _check_later(self, through: int) -> None:
        """Check the buckets still pending up to ``through`` (on the compute thread, the gate
        held), choosing the mode again where a probe moves (:meth:`_choose_mode_again`). A
        bucket's check that raises runs once more (:data:`CHECK_ATTEMPTS`), after freed
        memory is collected and returned: memory short for a moment need not close the
        worker, and the bucket stays pending in between, so nothing is encoded. Where it
        raises again, no mode passes, or choosing one raises, refuse to serve from then on:
        :attr:`closed`, and the worker's /readyz says not ready."""
        for attempt in range(1, CHECK_ATTEMPTS + 1):
            if self.closed:
                return
            try:
                moved = self.later.check(self.encoder, through)
            except Exception:
                pending = self.later.pending()
                bucket = pending[0] if pending else None
                if attempt == CHECK_ATTEMPTS:
                    self._close(bucket=bucket)
                    return
                logs.log_failure("encoder_bucket_check_failed", logging.WARNING, bucket=bucket)
            else:
                if moved:
                    try:
                        self._choose_mode_again(moved[0])
                    except Exception:  # never run again: it may have changed half the state
                        self._close()
                return
            # the error, and with it the failed call's frames and arrays, is gone here
            gc.collect()
            if _MALLOC_TRIM is not None:
                with contextlib.suppress(OSError):
                    _MALLOC_TRIM(0)

    def _choose_mode_again(self, where: str) -> None:
        """After a probe moved (``where``: no text): choose the mode again, with every bucket
        checked (:mod:`service.invariance`), and build the mechanisms again, at most
        :data:`MODE_CHOICES` times (then :class:`~service.invariance.NoInvariantModeError`)."""
        logs.log_event("encoder_bucket_moved", logging.WARNING, mode=self.encoder_mode, where=where)
        if self.rechoices >= MODE_CHOICES:
            raise NoInvariantModeError("no mode passed after three choices")
        self.rechoices += 1
        self.encoder_mode = self._batch_invariant_encoder(every_bucket=True, rejected=True)
        self._build_mechanisms()

    def _close(self, **fields: Any) -> None:
        """Refuse every item from now on (logged by :func:`~service.logs.log_failure`), and
        leave the :func:`closed_marker` for the server's other worker processes."""
        self.closed = True
        logs.log_failure("worker_refusing_to_serve", logging.ERROR, **fields)
        if self.closed_marker is not None:
            try:
                self.closed_marker.touch()
            except OSError:
                logs.log_failure("worker_closed_marker_failed", logging.ERROR)

    def _checked_buckets(
        self,
        requests: list[WorkRequest],
        live: list[tuple[int, int, WorkItem]],
        replies: list[list[WorkResult]],
    ) -> list[tuple[int, int, WorkItem]]:
        """Before a batch is encoded: check every bucket still pending, one at a time,
        whatever the batch holds (so what it holds never decides which checks run before it,
        which encoder encodes it, or whether it is refused), until none is left or every
        request of the batch has waited past :func:`check_limit`. The items to encode: those
        whose request has not (the others draw nothing: :data:`LATE`), or none, each
        answered :data:`CLOSED`, once the worker refuses to serve."""
        if not self.closed and faulted(self.fault_marker, [i for _, _, i in live], "close"):
            self._close(bucket=None)  # tests only: as if a check had raised twice
        if not live or (not self.closed and not self.later.pending()):
            return live
        while not self.closed and (pending := self.later.pending()):
            if all(time.time() > check_limit(requests[r]) for r, _, _ in live):
                break  # the rest is the checking thread's: these requests draw nothing
            self._check_later(pending[0])  # one bucket, or a new mode (at most three)
        if self.closed:
            for r, i, _ in live:
                replies[r][i] = CLOSED
            return []
        now = time.time()
        late = {r for r, _, _ in live if now > check_limit(requests[r]) or self.later.pending()}
        if late:
            metric("late_requests").inc(len(late))
        for r, i, _ in live:
            if r in late:
                replies[r][i] = LATE
        return [(r, i, item) for r, i, item in live if r not in late]

    def _reopen(self, device: str, cuda_graphs: bool) -> Any:
        """The bundle's encoder again, on ``device``, in fixed-shape batches (small ones on
        the CPU, where padding rows cost as much as real ones)."""
        from sentdp.encoders import open_encoder

        settings = load_settings()
        return open_encoder(
            self.encoder.path,
            self.bundle.encoder_backend,
            device,
            settings.fixed_batch_rows(device),
            fixed_batch=True,
            threads=settings.encoder_threads(),
            cuda_graphs=cuda_graphs,
            spin_between_runs=settings.encoder_spin_between_runs,
            onnx_threading=settings.encoder_threading,
            cpu_linear=settings.cpu_linear,
        )

    def _run(self, requests: list[WorkRequest], key: Hashable) -> list[WorkReply]:
        """Wait for this key's turn, at most until the last deadline of ``requests``: a
        request that cannot start in time returns unsampled well before the caller's timeout
        (waiting past it would turn into an answer lost after a possible sampling). Requests
        without items (:func:`service.worker_client.warm_dispatcher`) answer at once, without
        the gate, the compute thread or the batch metrics, and their deadlines never extend
        the wait of a batch they share with users' requests."""
        if not any(r.items for r in requests):  # the gateway's warm-up calls: nothing to do
            return [WorkReply(results=[]) for _ in requests]
        deadline = max(r.deadline for r in requests if r.items)
        with self.gate.turn(key, deadline) as turn:
            if turn.granted:
                return self.compute.run(self._compute, requests)
        metric("late_requests").inc(len(requests))
        # An adaptive batch's key is shared by every tenant: only a tenant's own key tells
        # that its wait came from its own backlog.
        late = BACKLOG if turn.behind_own and key != BATCH_KEY else LATE
        return [WorkReply(results=[late] * len(r.items)) for r in requests]

    def _compute(self, requests: list[WorkRequest]) -> list[WorkReply]:
        started = time.perf_counter()
        now = time.time()
        replies = [[LATE] * len(r.items) for r in requests]
        live: list[tuple[int, int, WorkItem]] = []
        for r, request in enumerate(requests):
            if not request.items:  # a warm-up call sharing the batch: nothing to answer
                continue
            if now > request.deadline:
                metric("late_requests").inc()
                continue
            for i, item in enumerate(request.items):
                refused = self._refusal(item)
                if refused:
                    replies[r][i] = WorkResult(sampled=False, error=refused)
                else:
                    live.append((r, i, item))
        live = self._checked_buckets(requests, live, replies)
        metric("batch_documents").observe(len(live))
        plans = self._plans([item for _, _, item in live], [requests[r].tenant for r, _, _ in live])
        ready = [(r, i, item, plan) for (r, i, item), plan in zip(live, plans, strict=True)]
        for r, i, _, plan in ready:
            if isinstance(plan, str):
                replies[r][i] = WorkResult(sampled=False, error=plan)
        ready = [entry for entry in ready if not isinstance(entry[3], str)]
        metric("worker_seconds").labels("prepare").observe(time.perf_counter() - started)
        if live:  # the encoding's activations are freed by now; before sampling, not after
            self.trim_memory(sum(len(item.sentences) for _, _, item in live))
        if ready:
            self._journal([item for _, _, item, _ in ready])
            chosen = DeepCandidate.draw_plans([plan for *_, plan in ready])
            self._inject_fault([item for _, _, item, _ in ready], "after")
            for (r, i, item, _), local in zip(ready, chosen, strict=True):
                if item.release == "vote":
                    replies[r][i] = WorkResult(label=int(local), sampled=True)
                    continue
                offset = self.variants[item.variant].record.offset
                replies[r][i] = WorkResult(candidate=offset + int(local), sampled=True)
        metric("worker_seconds").labels("total").observe(time.perf_counter() - started)
        return [WorkReply(results=results) for results in replies]

    def _refusal(self, item: WorkItem) -> str | None:
        """Why this worker must not draw for ``item`` (another bundle, or a rule its p table
        does not name), or None."""
        if item.model != self.version or item.variant not in self.variants:
            return f"this worker serves {self.version}, not {item.model}/{item.variant}"
        if item.radius is not None and (item.variant, item.radius) not in self.means:
            return f"the p table has no mean rule for {item.variant} at that radius"
        return None

    def _plans(self, items: list[WorkItem], tenants: list[str]) -> list[Any]:
        """A selection plan per item, or the reason it has none: all the work that draws no
        randomness. Done for the whole batch at once; if that fails, item by item, so that
        one item's failure never keeps the others from running."""
        if not items:
            return []
        try:
            return self._plan_together(items, tenants)
        except Exception:
            logs.logger.exception("planning a batch failed; planning its items one by one")
        plans: list[Any] = []
        for item, tenant in zip(items, tenants, strict=True):
            try:
                plans.extend(self._plan_together([item], [tenant]))
            except Exception as error:
                plans.append(f"{type(error).__name__} before sampling")
        return plans

    def _plan_together(self, items: list[WorkItem], tenants: list[str]) -> list[Any]:
        """Encode once with G; plan each vote item with SentenceVote (on G) and each
        candidate item in its variant (recoded), in item order."""
        self._inject_fault(items, "before")
        started = time.perf_counter()
        encoded = self._encode_distinct(items, tenants)
        metric("worker_seconds").labels("encode").observe(time.perf_counter() - started)
        bounds = np.cumsum([0] + [len(item.sentences) for item in items])
        documents = [encoded[bounds[n] : bounds[n + 1]] for n in range(len(items))]
        return plan_encoded(self.bundle, self.mechanisms, items, documents, self.means)

    def _encode_distinct(self, items: list[WorkItem], tenants: list[str]) -> np.ndarray:
        """Every item's sentence embeddings, in order, each distinct sentence of a tenant
        encoded once (see :func:`sentdp.encoders.encode_once`)."""
        from sentdp.encoders import encode_once

        keyed = [
            (tenant, sentence)
            for item, tenant in zip(items, tenants, strict=True)
            for sentence in item.sentences
        ]
        metric("batch_sentences").observe(len(keyed))
        return encode_once(self.encoder, keyed)

    def _inject_fault(self, items: list[WorkItem], stage: str) -> None:
        if faulted(self.fault_marker, items, stage):
            raise RuntimeError(f"injected fault {stage} sampling")

    def _journal(self, items: list[WorkItem]) -> None:
        if self.journal is None:
            return
        with self.journal.open("a") as handle:
            handle.write("".join(f"{item.charge_id}\n" for item in items))
            handle.flush()
            os.fsync(handle.fileno())


FAULT_MARKER: str | None = None
"""Tests only: a document whose first sentence is ``<marker>:before`` fails in the worker
before sampling, ``<marker>:after`` right after it, and ``<marker>:close`` makes the worker
process that receives it refuse to serve from then on (as if a bucket's check had raised
twice). Read when the worker starts. No setting reaches it: only code that runs in the
worker process before that can set it (``tests/faulty_server.py``, which the tests serve and
no Bento packs), so no deployment can be made to let a tenant fail or close its worker."""


def faulted(marker: str | None, items: list[WorkItem], stage: str) -> bool:
    """Tests only: whether an item's first sentence is ``<marker>:<stage>``."""
    return bool(marker) and any(i.sentences[:1] == [f"{marker}:{stage}"] for i in items)


def check_limit(request: WorkRequest) -> float:
    """Until when (Unix seconds) a request that started in time may still be encoded after
    waiting for the bucket checks: half the batching latency goal past its start deadline
    (by default 30 s after it, 60 s after its arrival), and at most 1.5 goals after its
    arrival (the worker's call times out after two, 120 s by default), so that what it
    draws is not drawn after its answer can no longer arrive. The start deadline alone
    refused the first request on a slow machine (the checks took 58 s on 2 cores shared
    with other work)."""
    goal, start = BOOT.worker_max_latency_ms / 1000, BOOT.worker_start_timeout_ms / 1000
    return min(request.deadline + goal / 2, request.deadline - start + 1.5 * goal)


def mean_mechanisms(
    bundle: Bundle, max_sentences: int | None = None
) -> dict[tuple[str, float], MeanCandidate]:
    """The clipped-mean rule of every (variant, radius) the bundle's p table names: the only
    ones a worker draws (an item naming another radius is refunded, never drawn). Refuses a
    rule that could not plan a document of ``max_sentences`` (the service's limit): it would
    refund every longer document instead of serving it."""
    means = {
        (c.variant, c.radius): bundle.variant(c.variant).mean_mechanism(c.radius)
        for c in bundle.manifest.p_table
        if c.selection == "mean" and c.radius is not None
    }
    for (name, radius), mean in means.items():
        if max_sentences is not None and mean.longest() < max_sentences:
            raise RuntimeError(
                f"the bundle's mean rule for {name} at radius {radius:g} plans documents of at "
                f"most {mean.longest()} sentences, below SENTDP_MAX_SENTENCES={max_sentences}"
            )
    return means


def plan_encoded(
    bundle: Bundle,
    mechanisms: dict[str, DeepCandidate],
    items: list[WorkItem],
    documents: list[np.ndarray],
    means: dict[tuple[str, float], MeanCandidate] | None = None,
) -> list[Any]:
    """Each item's selection plan from its document's G embeddings, in item order: a vote
    item with the bundle's vote the item names (by the epsilon-bounded-range exponential
    mechanism when the item asks for it; from the hard-vote table when it has at most the
    item's ``vote_table`` sentences), a candidate item in its variant (recoded), by Tukey
    depth or by the clipped-mean rule at one of the p table's radii (``means``). Items that
    share a vote (and its draw), or a variant and rule, are planned together."""
    from sentdp.encoders import recode

    plans: list[Any] = [None] * len(items)
    groups: dict[tuple[str, int, bool, float, int], list[int]] = {}
    for n, item in enumerate(items):
        if item.release == "vote":
            key = ("", item.vote, item.bounded_range, 0.0, item.vote_table)
        else:  # radii are at least 2**-100: 0.0 stands for Tukey depth
            key = (item.variant, 0, False, item.radius or 0.0, 0)
        groups.setdefault(key, []).append(n)
    for (name, vote, bounded, radius, table), members in sorted(groups.items()):
        epsilons = [items[n].epsilon for n in members]
        if not name:
            if vote >= len(bundle.votes):
                raise RuntimeError(f"this bundle has no SentenceVote {vote}")
            planned = bundle.votes[vote].plan_batch(
                [documents[n] for n in members],
                epsilons,
                texts=[items[n].sentences for n in members],
                bounded_range=bounded,
                table_sentences=table,
            )
            for n, plan in zip(members, planned, strict=True):
                plans[n] = plan
            continue
        # H is recoded for the group's rows at once: its fixed-shape blocks make a row's bits
        # independent of the rows beside it, so this equals recoding each document alone,
        # without padding every document to a block of its own
        rows = recode(bundle.variant(name).recoder, np.concatenate([documents[n] for n in members]))
        ends = np.cumsum([len(documents[n]) for n in members])
        recoded = np.split(rows, ends[:-1])
        if radius:
            mean = (means or {}).get((name, radius))
            if mean is None:
                raise RuntimeError(f"this bundle's p table has no mean rule for {name} at {radius}")
            planned = mean.plan_batch(recoded, epsilons)
        else:
            planned = mechanisms[name].plan_batch(recoded, epsilons, [items[n].p for n in members])
        for n, plan in zip(members, planned, strict=True):
            plans[n] = plan
    return plans
