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
from collections.abc import Callable
from typing import Any

from service import logs

Check = Callable[[Any], list[str]]
"""The start-up check on an encoder: where a probe moved (no text), empty when none did."""
Reopen = Callable[[str, bool], Any]
"""The bundle's encoder again in fixed-shape batches, on a device, with or without graphs."""


class StartUpCheck:
    """The check on an encoder as it will serve (where a probe moved, no text); it stops at
    the first batch that moves a probe, and records the buckets its probes covered.

    In fixed-shape batches, every count of real rows and position of a pass in the probes'
    buckets, several passes of a bucket in one call
    (:func:`~sentdp.encoders.fixed_batch_violations`); else mixed batches of several sizes,
    with every row count a pass can have swept in one bucket. With ``every_bucket``, then
    the same on a public probe filling each bucket the invariance probes miss
    (:func:`extra_probes`), apart, so that the first check stays exactly as it is; in plain
    buckets without the sweep, whose row counts in buckets of up to 256 tokens would cost
    seconds more."""

    def __init__(self, every_bucket: bool = False) -> None:
        self.every_bucket = every_bucket
        self.buckets: list[int] = []

    def __call__(self, encoder: Any) -> list[str]:
        from sentdp.encoders import INVARIANCE_PROBES

        self.buckets = []
        rounds: list[tuple[tuple[str, ...], bool]] = [(INVARIANCE_PROBES, True)]
        extra = extra_probes(encoder) if self.every_bucket else ()
        if extra:  # none where the invariance probes reach every bucket
            rounds.append((extra, False))
        for probes, sweep in rounds:
            found = _violations(encoder, probes, sweep)
            if found:
                return found
            self.buckets = sorted({*self.buckets, *encoder.buckets_of(list(probes))})
        return []

    def report(self, max_tokens: int) -> tuple[int, dict[str, Any]]:
        """The log level and fields of the buckets the last passing check covered and those
        it did not, for an encoder of ``max_tokens``: a warning when every bucket was asked
        for and one got no probe."""
        from sentdp.encoders import length_buckets

        unchecked = sorted(set(length_buckets(max_tokens)) - set(self.buckets))
        level = logging.WARNING if self.every_bucket and unchecked else logging.INFO
        return level, {
            "buckets": self.buckets,
            "unchecked": unchecked,
            "every_bucket": self.every_bucket,
        }


def _violations(encoder: Any, probes: tuple[str, ...], sweep: bool) -> list[str]:
    from sentdp.encoders import batch_invariance_violations, fixed_batch_violations

    if encoder.fixed_batch:
        return fixed_batch_violations(encoder, probes, first_only=True)
    rows = encoder.batch_size if sweep else 0
    return batch_invariance_violations(encoder, probes, sweep_rows=rows, first_only=True)


def extra_probes(encoder: Any) -> tuple[str, ...]:
    """A public probe for each bucket the invariance probes miss, the two shortest first and
    last: the mixed-batch check builds batches of copies of those two."""
    from sentdp.encoders import INVARIANCE_PROBES, bucket_probes

    reached = set(encoder.buckets_of(list(INVARIANCE_PROBES)))
    extra = [probe for bucket, probe in bucket_probes(encoder).items() if bucket not in reached]
    if len(extra) > 2:
        extra = [extra[0], *extra[2:], extra[1]]
    return tuple(extra)


def invariant_encoder(
    encoder: Any,
    reopen: Reopen,
    check: Check,
    cuda_graphs: bool,
    deterministic: Callable[[], None],
) -> tuple[Any, str]:
    """The encoder to serve with and its mode (``cpu``, ``cuda``, ``cpu-fixed-batch``,
    ``cuda-fixed-batch`` or ``cpu-fallback``); raises when every mode moves a probe."""
    device = str(encoder.device)
    cuda = device.startswith("cuda")
    kind = "cuda" if cuda else "cpu"
    if not check(encoder):
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
        except Exception as error:  # its stack, never its message (the handlers drop those)
            event = "cuda_graph_capture_failed" if graphs else "fixed_batch_encoder_failed"
            fields = {"event": event, "device": on, "error": type(error).__name__}
            logs.logger.warning(event, exc_info=True, extra={"sentdp_fields": fields})
    # fail closed: batching would let one sentence move another's embedding
    logs.log_event("encoder_not_batch_invariant", logging.ERROR, device=device)
    raise RuntimeError(
        "the encoder's output depends on its batch even in fixed-shape batches; "
        "refusing to serve (see the encoder_not_batch_invariant log event)"
    )


def _serving(encoder: Any, device: str, mode: str) -> tuple[Any, str]:
    # Fixed-shape batches are a checked, safe mode (the usual one on CUDA and on AVX-512
    # CPUs); only a CUDA worker that fell back to the CPU is worth a warning.
    level = logging.WARNING if mode == "cpu-fallback" else logging.INFO
    graphs = bool(getattr(encoder, "cuda_graphs", False))
    logs.log_event("encoder_batch_invariance", level, device=device, mode=mode, cuda_graphs=graphs)
    return encoder, mode
