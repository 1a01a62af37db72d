"""The worker's start-up choice of how to encode: a mode in which batching cannot move any
sentence's embedding, or no mode at all (the worker then refuses to serve).

Kernels may vary with a batch's row count (cuBLAS on a GPU, AVX-512 kernels on some CPUs), so
a sentence's embedding could depend on who else is in its batch. The worker checks the encoder
as it will serve and, if the check fails, tries in turn: fixed-shape batches on the same
device (on CUDA with deterministic kernels, replayed as CUDA graphs where enabled, eager
passes if capturing or checking the graphs fails), then, for CUDA, fixed-shape batches on the
CPU. The log says which mode serves; failures are logged by exception type only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from service import logs


class NoInvariantModeError(RuntimeError):
    """Every mode tried moved a probe or failed to open or check, or the worker chose its
    mode too often: it must not serve."""


Check = Callable[[Any], list[str]]
"""The start-up check on an encoder: where a probe moved (no text), empty when none did."""
Reopen = Callable[[str, bool], Any]
"""The bundle's encoder again in fixed-shape batches, on a device, with or without graphs."""


class StartUpCheck:
    """The check on an encoder as it will serve (where a probe moved, no text); it stops at
    the first batch that moves a probe, and records the buckets it covered.

    In fixed-shape batches, every count of real rows and position of a pass in the probes'
    buckets, several passes of a bucket in one call
    (:func:`~sentdp.encoders.fixed_batch_violations`); else mixed batches of several sizes,
    with every row count a pass can have swept in one bucket. With ``every_bucket``, then
    each bucket the invariance probes miss, apart (so the first check stays exactly as it
    is), as :class:`LaterChecks` checks it after start-up otherwise."""

    def __init__(self, every_bucket: bool = False, when: str = "start-up") -> None:
        self.every_bucket = every_bucket
        self.when = when
        """Logged with each bucket checked apart: ``later`` when the mode is chosen
        again after a later check failed."""
        self.buckets: list[int] = []

    def __call__(self, encoder: Any) -> list[str]:
        from sentdp.encoders import INVARIANCE_PROBES

        self.buckets = []
        found = _violations(encoder, INVARIANCE_PROBES, sweep=True)
        if found:
            return found
        self.buckets = sorted(set(encoder.buckets_of(list(INVARIANCE_PROBES))))
        if self.every_bucket:
            later = LaterChecks(encoder, self.buckets, self.when)
            moved = later.check(encoder)
            if moved:
                return moved
            self.buckets = sorted({*self.buckets, *later.checked})
        return []

    def report(self, max_tokens: int, later: Sequence[int] = ()) -> tuple[int, dict[str, Any]]:
        """The log level and fields of the buckets the last passing check covered, those it
        did not, and those left to ``later`` checks, for an encoder of ``max_tokens``: a
        warning when a bucket is neither checked nor left to later (no probe lands in it)."""
        from sentdp.encoders import length_buckets

        unchecked = sorted(set(length_buckets(max_tokens)) - set(self.buckets))
        level = logging.WARNING if set(unchecked) - set(later) else logging.INFO
        return level, {
            "buckets": self.buckets,
            "unchecked": unchecked,
            "later": list(later),
            "every_bucket": self.every_bucket,
        }


class LaterChecks:
    """The length buckets the start-up check's probes did not reach, each checked on two
    public probes that land in it, the longest and the shortest run of words
    (:func:`sentdp.encoders.bucket_probe_pairs`), beside the shortest invariance probe, in the
    encoder's mode (:func:`bucket_violations`), smallest bucket first.

    The worker checks them one per turn at its gate once it has started, and is ready only
    when all have passed; a batch that comes earlier checks every bucket still pending before
    it is encoded, whatever it holds: which buckets are checked, in what order, with what
    outcome, and which batches wait for them, depend on public probes and on time only,
    never on what a batch's documents say. ``when`` (``start-up`` or ``later``) is logged
    with each bucket checked."""

    def __init__(self, encoder: Any, covered: Sequence[int], when: str) -> None:
        from sentdp.encoders import bucket_probe_pairs

        self._probes = {
            b: tuple(dict.fromkeys(pair))  # one probe where both runs are the same
            for b, pair in bucket_probe_pairs(encoder).items()
            if b not in covered
        }
        self.when = when
        self.checked: list[int] = []
        """The buckets that passed, in the order checked."""
        self._lock = threading.Lock()  # pending() is read by the worker's checking thread

    def pending(self) -> list[int]:
        """The buckets not checked yet, smallest first."""
        with self._lock:
            return list(self._probes)

    def check(self, encoder: Any, through: int | None = None) -> list[str]:
        """Check each pending bucket (up to ``through``), smallest first, and stop at the
        first where a probe moves (it stays pending): where it moved, empty when all
        passed."""
        for bucket in self.pending():
            if through is not None and bucket > through:
                break
            started = time.perf_counter()
            found = bucket_violations(encoder, self._probes[bucket], bucket <= FULL_PASS_BUCKET)
            if found:
                return [f"bucket {bucket}: {line}" for line in found]
            with self._lock:
                del self._probes[bucket]
                self.checked.append(bucket)
            seconds = round(time.perf_counter() - started, 3)
            logs.log_event(
                "encoder_bucket_checked",
                logging.INFO,
                bucket=bucket,
                seconds=seconds,
                when=self.when,
            )
        return []


FULL_PASS_BUCKET = 64
"""The largest bucket whose later check in plain buckets builds a full pass (32 rows): a full
pass of a larger bucket was two thirds of the checks' time and took the worker's memory to
a full pass of 256-token sentences (torch: 773 MiB at its peak against 406 MiB; int8 kept
474 MiB against 215 MiB, measured in one process)."""


def bucket_violations(encoder: Any, probes: Sequence[str], full_pass: bool = True) -> list[str]:
    """Where ``probes`` (of one bucket, the longest first) move in calls beside the shortest
    invariance probe, stopping at the first call that moves one. In fixed-shape passes,
    every count of real rows and position of a pass, the probes rotated and in full passes
    of copies (:func:`~sentdp.encoders.fixed_batch_violations`); else rows cycling through
    the probes at several row counts, and a pass of the shortest alone
    (:func:`~sentdp.encoders.copies_violations`: the mixed-batch check's layouts cost 4-5
    times as much in a bucket of 256 tokens, measured), a full pass then one row only with
    ``full_pass``."""
    from sentdp.encoders import INVARIANCE_PROBES, copies_violations, fixed_batch_violations

    short = INVARIANCE_PROBES[0]
    if encoder.fixed_batch:
        return fixed_batch_violations(encoder, (short, *probes), first_only=True)
    counts = None if full_pass else (1, 2, 3, 8)
    return copies_violations(encoder, probes, short, counts, first_only=True)


def _violations(encoder: Any, probes: tuple[str, ...], sweep: bool) -> list[str]:
    from sentdp.encoders import batch_invariance_violations, fixed_batch_violations

    if encoder.fixed_batch:
        return fixed_batch_violations(encoder, probes, first_only=True)
    rows = encoder.batch_size if sweep else 0
    return batch_invariance_violations(encoder, probes, sweep_rows=rows, first_only=True)


def invariant_encoder(
    encoder: Any,
    reopen: Reopen,
    check: Check,
    cuda_graphs: bool,
    deterministic: Callable[[], None],
    rejected: bool = False,
    device: str | None = None,
) -> tuple[Any, str]:
    """The encoder to serve with and its mode (``cpu``, ``cuda``, ``cpu-fixed-batch``,
    ``cuda-fixed-batch`` or ``cpu-fallback``); raises when every mode moves a probe. With
    ``rejected``, ``encoder`` already failed a check (a later bucket's): only the
    fixed-shape modes are tried, afresh, even when ``encoder`` is in one. ``device``: the
    one the worker was asked for (by default ``encoder``'s; a CUDA worker whose encoder fell
    back to the CPU still tries CUDA first when its mode is chosen again)."""
    device = device or str(encoder.device)
    cuda = device.startswith("cuda")
    kind = "cuda" if cuda else "cpu"
    if not rejected and not check(encoder):
        return _serving(encoder, device, kind)
    tries = [(device, True), (device, False)] if cuda and cuda_graphs else [(device, False)]
    if cuda:
        tries.append(("cpu", False))
    for on, graphs in tries:
        mode = f"{kind}-fixed-batch" if on == device else "cpu-fallback"
        try:
            if on.startswith("cuda"):
                deterministic()
            candidate = reopen(on, graphs)
            candidate.warm_up()  # graphed passes are captured here, every bucket
            if not check(candidate):
                return _serving(candidate, device, mode)
            logs.log_event(
                "encoder_mode_failed_check", logging.WARNING, device=on, mode=mode, graphs=graphs
            )
        except Exception:  # its stack, never its message (the handlers drop those)
            event = "cuda_graph_capture_failed" if graphs else "fixed_batch_encoder_failed"
            logs.log_failure(event, logging.WARNING, device=on)
    # fail closed: batching would let one sentence move another's embedding
    logs.log_event("encoder_not_batch_invariant", logging.ERROR, device=device)
    raise NoInvariantModeError(
        "the encoder's output depends on its batch even in fixed-shape batches; "
        "refusing to serve (see the encoder_not_batch_invariant log event)"
    )


def _serving(encoder: Any, device: str, mode: str) -> tuple[Any, str]:
    # Fixed-shape batches are a checked, safe mode (the usual one on CUDA and on AVX-512
    # CPUs); only a CUDA worker that fell back to the CPU is worth a warning.
    level = logging.WARNING if mode == "cpu-fallback" else logging.INFO
    graphs = bool(getattr(encoder, "cuda_graphs", False))
    linear = getattr(encoder, "cpu_linear", None)  # torch on the CPU: blas or onednn
    # auto kept BLAS because oneDNN would round below float32 (the operator's environment)
    note = getattr(encoder, "cpu_linear_note", None)
    extra = {"cpu_linear_note": note} if note else {}
    logs.log_event(
        "encoder_batch_invariance",
        logging.WARNING if note else level,
        device=device,
        mode=mode,
        cuda_graphs=graphs,
        cpu_linear=linear,
        **extra,
    )
    return encoder, mode
