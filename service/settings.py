"""Settings of the service, read from ``SENTDP_*`` environment variables when a process starts.

Two moments read them. :func:`boot_settings` is read once per process when
:mod:`service.worker` and :mod:`service.gateway` are imported, because BentoML needs some
numbers while the service classes are being declared (the model tag, worker counts, batch
sizes, timeouts, body limits of the middleware). Everything else is read again with
:func:`load_settings` when a service instance starts. Both read the same environment, so they
agree unless the environment changes between import and start-up.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

WORKER_CALL_SHARE = 0.9
"""The share of SENTDP_IDEMPOTENCY_PENDING_SECONDS, counted from a request's arrival, after
which the gateway gives its worker call up (an unknown outcome: charged). Ending before the
key's pending window does, no call can outlive its key and see a retry sample again."""
REQUEST_OVERHEAD_BYTES = 16 * 1024
"""What each request to a charged route counts against its tenant's bytes in flight besides
its body: a connection and its task hold memory even with an empty body."""


def _data_dir(data: dict[str, Any]) -> Path:
    """Where the ledger, tenants file and secret live by default: ``state_dir`` (a mounted
    volume in a container), else the user's data folder."""
    state = data.get("state_dir")
    return Path(state) if state else platformdirs.user_data_path("sentdp")


def _unset_if_empty(value: object) -> object:
    """``SENTDP_STATE_DIR=`` means unset, not the current folder (pydantic reads "" as ".")."""
    return None if isinstance(value, str) and not value.strip() else value


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SENTDP_", extra="ignore")

    model: str = "sentdp-bbc-news:latest"
    """BentoML model tag of the bundle to serve."""
    state_dir: Annotated[Path | None, BeforeValidator(_unset_if_empty)] = None
    """Default folder of the ledger, the tenants file and the idempotency secret (each can
    still be set on its own); in a container, a mounted volume."""
    allow_ephemeral_state: bool = False
    """In a container, start even when the ledger, tenants or secret would be lost with the
    container (demos only: recreating it resets every user's spent epsilon)."""
    ledger_url: str = Field(
        default_factory=lambda data: f"sqlite:///{_data_dir(data) / 'ledger.sqlite3'}"
    )
    """``sqlite:///file`` (default) or ``postgresql://...`` shared by several replicas."""
    ledger_schema: str = "public"
    """PostgreSQL schema of the ledger tables."""
    idempotency_secret_file: Path = Field(
        default_factory=lambda data: _data_dir(data) / "idempotency-secret"
    )
    """HMAC secrets of request bodies under Idempotency-Keys (created 0600 when missing; one
    hex secret per line, the first current). Keep it out of the ledger's backups; replicas
    share one."""
    tenants_file: Path = Field(default_factory=lambda data: _data_dir(data) / "tenants.json")
    """Tenants, their hashed API keys and budgets (see ``sentdp-admin``)."""
    metrics_token: str | None = Field(default=None, min_length=16)
    """Bearer token that /metrics requires; /metrics answers 403 while unset (its series, such
    as batch sizes in sentences, would let a reader infer a request's k)."""
    max_documents: int = Field(default=16, ge=1)
    max_sentences: int = Field(default=1000, ge=1)
    """Sentences in one document (more is refused with 413; k is public)."""
    max_request_sentences: int = Field(default=1000, ge=1)
    """Sentences in one request, all documents together."""
    max_request_tokens: int = Field(default=40_000, ge=256)
    """Work of one request in padded tokens (the encoder's length buckets): its distinct
    sentences' (the worker encodes a repeated sentence once) plus one per sentence for
    recoding and planning; about 7 s on 2 CPU cores, well within the worker's timeout. Long
    sentences cost more."""
    tenant_inflight_tokens: int = Field(default=40_000, ge=256)
    """Padded tokens one tenant may have in flight per gateway process; beyond, 429 and
    nothing charged. At least ``max_request_tokens``, so the largest request is admissible."""
    tenant_inflight_requests: int = Field(default=64, ge=1)
    """Requests one tenant may have in flight per gateway process, however small: a request
    weighs at least ``tenant_inflight_tokens / tenant_inflight_requests`` tokens (each costs
    two ledger writes whatever its size)."""
    tenant_checks: int = Field(default=1, ge=1)
    """A tenant's requests checked (split, tokenized, signed) at once per gateway process."""
    tenant_checks_waiting: int = Field(default=256, ge=0)
    """A tenant's requests that may wait to be checked per gateway process; beyond, 429."""
    batch_max_tokens: int = Field(default=4_000, ge=1)
    """A request of more padded tokens than this bypasses adaptive batching, so one batch
    costs at most ``worker_batch_size`` times this."""
    worker_start_timeout_ms: int = Field(default=30_000, ge=100)
    """A request whose computation has not started this long after its charge is refunded
    (it draws nothing); well below the worker's timeout, so no answer is lost after sampling."""
    max_sentence_chars: int = Field(default=2000, ge=1)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds a charged request's body may take to arrive; slower: 408 ``body_timeout``
    (nothing charged), and the bytes it held for its tenant are given back."""
    tenant_inflight_bytes: int | None = None
    """Bytes of request bodies one tenant may have in this gateway process at once, from
    the request's arrival to its response (waiting to be scanned, checked or run), each
    request counting at least ``REQUEST_OVERHEAD_BYTES`` (16 KiB) more; beyond, 429.
    Bounds the memory a tenant's queued requests hold. At least ``max_body_bytes`` plus
    that overhead; unset: 8 requests of the largest size (32 MiB and 128 KiB)."""
    max_json_depth: int = Field(default=32, ge=4)
    tenant_stored_reply_bytes: int = Field(default=2**30, ge=0)
    """Bytes of one tenant's replies the ledger keeps for Idempotency-Key retries, in every
    replica together (about 8.5 KB per document at 384 dimensions). A reply that would pass
    it is kept as a short 410 ``reply_not_kept`` instead: the request is served and charged
    as always, and a retry of its key is told the reply was not kept (it never pays twice).
    Bounds the bytes of one tenant's replies in the shared ledger (soft: replies being stored
    at once may each pass it by one reply), not its rows: keys, stand-ins and charge rows still
    grow with its requests."""
    idempotency_pending_seconds: float = Field(default=300.0, gt=0)
    """A request unfinished after this long is abandoned; its key can then be reused."""
    device: str | None = None
    """torch device of the worker (unset or ``auto``: CUDA when present, else the CPU)."""
    cuda_graphs: bool = True
    """On CUDA, replay each bucket's fixed-shape pass as a captured CUDA graph (False: eager
    passes, measured bit-identical on an H100). The worker falls back to eager passes by
    itself when capturing or checking the graphs fails."""
    worker_threads: int | None = Field(default=None, ge=1)
    """Threads of each worker process's encoder (torch or ONNX Runtime); unset:
    :meth:`encoder_threads`."""
    encoder_backend: Literal["torch", "onnx", "onnx-int8"] | None = None
    """The encoder backend this deployment expects (torch, onnx, onnx-int8); the worker
    refuses a bundle trained with another. Unset: whichever the bundle was trained with."""
    adaptive_batching: bool = True
    """False: the gateway calls the worker's non-batchable twin endpoint (for measurements)."""
    batch_max_sentences: int = Field(default=400, ge=1)
    """A request with more sentences than this bypasses adaptive batching (the twin endpoint),
    so one batch of ``worker_batch_size`` requests holds at most that many times this (12,800
    rows: about 0.6 s of recoding and planning on 2 CPU cores; encoding is bounded by
    ``batch_max_tokens``). Batching a tenant's requests together lets the worker encode a
    sentence they share once."""
    worker_batch_size: int = Field(default=32, ge=1)
    worker_max_latency_ms: int = Field(default=60_000, ge=100)
    memory_trim_interval_s: float = Field(default=1.0, ge=0)
    """Least seconds between the worker's returns of freed heap pages to the system (glibc's
    ``malloc_trim``, after a batch's encoding). One return walks the whole heap: 8 ms in a
    plain process and 16-19 ms in the worker with ONNX Runtime int8 (measured), paid by
    each lone document at concurrency 1 when done after every batch. 0: after every batch."""
    encoder_threading: Literal["rows", "operators"] = "rows"  # sentdp.encoders.OnnxThreading
    """How an ONNX encoder uses its ``worker_threads``: ``rows``, each pass cut into row
    pieces run side by side, one thread each; ``operators``, ONNX Runtime's split of every
    operator over the threads (before the twenty-eighth session). On 2 cores (int8) the
    encoder alone ran 1.03-1.32x as fast with rows, the service 2-9% faster at concurrency 1
    and between 4% slower and 33% faster at 32 (docs/performance.md, "Threads over rows").
    torch bundles ignore it."""
    cpu_linear: Literal["auto", "blas", "onednn"] = "auto"  # sentdp.torch_bert.CpuLinear
    """How a torch bundle's encoder runs its linear layers on the CPU: ``blas`` (torch's MKL,
    sentence-transformers' bits), ``onednn`` (weights packed once; 2.4x MKL's linear layers and
    about 2x the encoder on a 2-core AMD EPYC Zen 5, whose AVX-512 MKL leaves unused; on an
    Intel Xeon with AMX as fast as MKL, and the only one whose rows kept their bits in plain
    buckets), or ``auto``: oneDNN on AMD and Intel CPUs, BLAS elsewhere and where oneDNN
    would round below float32 (``ONEDNN_DEFAULT_FPMATH_MODE=BF16``, which ``onednn`` refuses).
    The worker's start-up check runs on the encoder as it serves either way. A bundle
    records ``onednn`` when its training ran it; serving chooses by this setting, whatever
    the bundle records (the bits differ by about 3e-7). ONNX bundles ignore it, and so does a
    worker on a GPU unless it falls back to the CPU."""
    encoder_spin_between_runs: bool = False
    """Keep ONNX Runtime's threads spinning after each encoder run, its own default (torch
    bundles ignore it; in ``rows`` threading no run has more than one thread). Off, they stop
    when the run returns: a spinning thread holds a core that the gateway, the ledger and the
    next request's checks need (measured with the int8 BBC News bundle: docs/performance.md,
    "ONNX Runtime's threads after a run")."""
    encode_batch_size: int | None = Field(default=None, ge=1)
    """Rows per encoder pass (:meth:`encoder_rows`); unset: 32. On the CPU one pass's
    activations are the top of the worker's memory (torch, BBC News, concurrency 32: the
    whole server peaked at 989-1,067 MiB with 64 rows, 935-953 MiB with 32; the encoder alone
    ran 2% slower, measured). On an H100, where every pass has this fixed shape: concurrency 1
    863 against 683 sentences/s with 64 rows, concurrency 32 2,923 against 2,982
    (docs/performance.md)."""
    check_every_bucket: bool = False
    """Where the worker checks the length buckets the invariance probes miss (for
    all-MiniLM-L6-v2 the buckets of 24, 48 and 96 to 256 tokens), on public probes that land
    in them: true, inside its start-up (:class:`service.invariance.StartUpCheck`); false, on a
    thread of its own once it has started (:class:`service.invariance.LaterChecks`). Either
    way it is not ready until every bucket has passed, and a batch waits for them before it
    is encoded, whatever it holds. Measured on 2 CPU cores the two cold starts were the same
    (docs/performance.md, "Every bucket checked, after start-up")."""
    cpu_fixed_batch_size: int = Field(default=8, ge=1)
    """Rows of every encoder pass on the CPU when the start-up check asks for fixed-shape
    batches: each bucket of a batch is padded to a multiple of this, so a small value wastes
    little on a lone document (64 rows made one document ~7x slower to encode; 8 rows lose
    nothing at full load, measured)."""
    gateway_workers: int | None = Field(default=None, ge=1)
    """Gateway processes; unset: :func:`default_gateway_workers` (1 on a machine of at most
    2 cores, 2 otherwise; on a GPU deployment one per two cores)."""
    worker_processes: int | None = Field(default=None, ge=1)
    """Worker processes, each with its own encoder, batches and compute thread (on one GPU
    they share it). Each runs the start-up check and holds the bundle (~380 MiB on the CPU).
    Unset: 1, or :func:`default_worker_processes` on a GPU deployment."""
    worker_gpus: int = Field(default=0, ge=0)
    """GPUs the worker service requests from the deployment (0: run on what is there)."""
    sample_journal: Path | None = None
    """When set, the worker appends each charge id here before drawing its randomness (audits,
    fault tests); the journal holds ids only, never text."""

    @field_validator("device")
    @classmethod
    def _auto_is_unset(cls, device: str | None) -> str | None:
        from sentdp.encoders import named_device

        return named_device(device)

    @property
    def names_a_gpu(self) -> bool:
        """The deployment asks for a GPU: a CUDA ``SENTDP_DEVICE``, or with no device named,
        ``SENTDP_WORKER_GPUS`` >= 1; decided without importing torch, in every process."""
        if self.device is not None:  # an explicit device wins: the GPU image run on a CPU
            return self.device.startswith("cuda")
        return self.worker_gpus > 0

    def gateway_count(self, cpus: int | None = None) -> int:
        """Gateway processes: ``SENTDP_GATEWAY_WORKERS``, else :func:`default_gateway_workers`."""
        return self.gateway_workers or default_gateway_workers(cpus, gpu=self.names_a_gpu)

    def worker_count(self, cpus: int | None = None) -> int:
        """Worker processes: ``SENTDP_WORKER_PROCESSES``, else 1 on the CPU (more would split
        the same cores) and :func:`default_worker_processes` on a GPU deployment."""
        if self.worker_processes is not None:
            return self.worker_processes
        return default_worker_processes(cpus) if self.names_a_gpu else 1

    def encoder_threads(self, cpus: int | None = None) -> int:
        """Threads of each worker's encoder: ``SENTDP_WORKER_THREADS``, else 2 where each
        worker process has two cores of its own, else what the cores allow (at least 1).
        Worker processes whose threads outnumber the cores wait on each other at every
        parallel region: two torch workers on 2 cores started in 32-38 s and served 34
        sentences/s with 2 threads each, against 14 s and 131 sentences/s with one each
        (docs/performance.md, "Worker threads sized to the cores"). More than 2 per worker
        is not measured: set it on a larger CPU machine."""
        if self.worker_threads is not None:
            return self.worker_threads
        cpus = usable_cpus() if cpus is None else cpus
        return max(1, min(2, cpus // self.worker_count(cpus)))

    def encoder_rows(self, device: str) -> int:
        """Rows per encoder pass on ``device`` (a torch device name, or "cpu")."""
        if self.encode_batch_size is not None:
            return self.encode_batch_size
        return 32

    def gateway_timeout_s(self) -> float:
        """BentoML's request timeout of the gateway: twice the worker's latency goal, plus
        30 s for the ledger and the hop."""
        return self.worker_max_latency_ms / 1000 * 2 + 30

    def inflight_bytes(self) -> int:
        """``tenant_inflight_bytes``, or its default: 8 requests of the largest size."""
        if self.tenant_inflight_bytes is not None:
            return self.tenant_inflight_bytes
        return 8 * (self.max_body_bytes + REQUEST_OVERHEAD_BYTES)

    def fixed_batch_rows(self, device: str) -> int:
        """Rows of every pass when the start-up check asks for fixed-shape batches: the
        device's usual rows on CUDA, ``cpu_fixed_batch_size`` on the CPU."""
        if device.startswith("cuda"):
            return self.encoder_rows(device)
        return self.cpu_fixed_batch_size

    @model_validator(mode="after")
    def _largest_request_is_admissible(self) -> ServiceSettings:
        if self.tenant_inflight_tokens < self.max_request_tokens:
            raise ValueError(
                "SENTDP_TENANT_INFLIGHT_TOKENS must be at least SENTDP_MAX_REQUEST_TOKENS"
            )
        if self.inflight_bytes() < self.max_body_bytes + REQUEST_OVERHEAD_BYTES:
            raise ValueError(
                "SENTDP_TENANT_INFLIGHT_BYTES must be at least SENTDP_MAX_BODY_BYTES + 16384, "
                "or the largest body could never be admitted"
            )
        if self.idempotency_pending_seconds * WORKER_CALL_SHARE <= self.gateway_timeout_s():
            raise ValueError(
                f"SENTDP_IDEMPOTENCY_PENDING_SECONDS x {WORKER_CALL_SHARE:g} must exceed the "
                "gateway's timeout "
                "(2 x SENTDP_WORKER_MAX_LATENCY_MS + 30 s), or a running request's key "
                "could be taken over, or its worker call given up before the worker's own "
                "timeouts"
            )
        if self.body_timeout_s >= self.gateway_timeout_s():
            raise ValueError(
                "SENTDP_BODY_TIMEOUT_S must stay below the gateway's request timeout "
                "(2 x SENTDP_WORKER_MAX_LATENCY_MS + 30 s), or a slow body gets BentoML's 504"
            )
        if self.worker_start_timeout_ms >= self.worker_max_latency_ms * 2:
            raise ValueError(
                "SENTDP_WORKER_START_TIMEOUT_MS must stay below the worker's timeout "
                "(2 x SENTDP_WORKER_MAX_LATENCY_MS)"
            )
        return self


def load_settings() -> ServiceSettings:
    """Read the environment now: what a service instance uses when it starts. A variable that
    cannot be used is a :class:`~sentdp.errors.SettingsError` naming it without its value
    (pydantic's own message quotes values: the ledger URL's password, the metrics token)."""
    from sentdp.errors import SettingsError

    try:
        return ServiceSettings()
    except ValidationError as error:
        problem = SettingsError.from_validation(error)
    # raised out here, so that pydantic's error (it quotes the values) is not its context
    raise problem


ACCESS_LOG = {
    "access": {
        "request_content_length": False,
        "response_content_length": False,
        "request_content_type": False,
        "response_content_type": False,
    }
}
"""BentoML's access log without body sizes: a body's length tells its reader about the
document's size (and so about k)."""


@functools.cache
def boot_settings() -> ServiceSettings:
    """The settings the service classes are declared with, read once per process.

    Use only for what BentoML needs at class-definition time (decorator arguments, the
    model reference, middleware options); read everything else with :func:`load_settings`.
    """
    return load_settings()


def usable_cpus(
    cgroup: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> int:
    """The cores this process may run on (a container's cpuset, else all), fewer when its
    cgroup, or one above it, allows fewer (``docker run --cpus``, a Kubernetes CPU limit, a
    systemd unit's ``CPUQuota``)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cgroup, own_cgroup(membership))
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def own_cgroup(membership: Path = Path("/proc/self/cgroup")) -> str:
    """This process's cgroup v2 path under the mount (``/`` in a container's own cgroup
    namespace, and when it cannot be read)."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return "/"
    return next((line[3:] or "/" for line in lines if line.startswith("0::")), "/")


def cgroup_cpu_quota(cgroup: Path, own: str = "/") -> float | None:
    """Cores' worth of CPU time allowed to the cgroup ``own`` under the mount ``cgroup``: the
    smallest cgroup v2 ``cpu.max`` of it and every cgroup above it (each limits the ones
    below), else v1's CFS quota and period at the mount; None when none sets a limit or
    can be read."""
    parts = [part for part in own.split("/") if part and part != "."]
    if ".." in parts:  # a cgroup outside this namespace's root: its files are not mounted here
        parts = []
    quotas = [_quota_at(cgroup.joinpath(*parts[:depth])) for depth in range(len(parts) + 1)]
    found = [quota for quota in quotas if quota is not None]
    return min(found) if found else None


def _quota_at(cgroup: Path) -> float | None:
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        allowed, every = float(quota), float(period)
    except ValueError:  # "max": no limit
        return None
    return allowed / every if allowed > 0 and every > 0 else None


def default_gateway_workers(cpus: int | None = None, gpu: bool = False) -> int:
    """Gateway processes when ``SENTDP_GATEWAY_WORKERS`` is unset: the gateways only parse,
    charge and forward (the worker encodes), and each holds BentoML and the bundle (~230 MiB).
    Measured on 2 cores (``loadtests/gateways.py``): one serves as fast as two and lowers peak
    RSS by ~235 MiB and cold start by ~1 s; a second one pays off only with cores to spare.
    On a GPU deployment the workers keep the GPU busy only if the gateways keep up: one per
    two cores, at most 8 (the most measured: on the 16-core H100 machine). Per-tenant limits
    that hold per gateway process (in-flight tokens, requests, bytes and checks) grow with
    the count."""
    cpus = usable_cpus() if cpus is None else cpus
    if cpus <= 2:
        return 1
    return min(8, max(2, cpus // 2)) if gpu else 2


def default_worker_processes(cpus: int | None = None) -> int:
    """Worker processes of a GPU deployment when ``SENTDP_WORKER_PROCESSES`` is unset: one
    per four cores, at most four. Each worker plans its batches on one Python thread while
    the others' batches use the GPU; on one H100 with 16 cores four workers served 1.64x
    one and 1.09-1.10x two at concurrency 32, six less than four (docs/performance.md)."""
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(4, cpus // 4))
