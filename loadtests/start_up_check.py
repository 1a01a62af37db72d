"""What the worker's start-up check costs, per bundle and encoder mode, in one process.

Run: ``.venv/bin/python loadtests/start_up_check.py TAG [TAG ...] [--repeats 3] [--every-bucket]``

For each bundle's encoder on the CPU (the worker's threads and rows per pass, from the
settings): the check of plain length buckets (``batch_invariance_violations`` with every row
count of one bucket swept), and for fixed-shape passes both the same check (what the worker
ran on them before the thirtieth session) and ``fixed_batch_violations`` (what it runs now).
Each is run in full (not stopping at a violation), ``--repeats`` times, alternating; the
table gives the encoder passes, the median seconds, how many probe rows moved, and the ratio
of the fixed-shape check now to before.

With ``--every-bucket``, also each check once for every bucket the worker's start-up
probes do not reach, on a public probe that fills it (:func:`sentdp.encoders.bucket_probes`):
the worker checks those buckets more leanly before it is ready
(:class:`service.invariance.LaterChecks`), so this is how to see in full whether this
machine's kernels keep their rows apart there too.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class PassCounter:
    """The encoder with its passes counted: a call's sentences, grouped by bucket, in passes
    of ``batch_size`` rows (what :func:`sentdp.encoders.bucket_passes` makes of them)."""

    def __init__(self, encoder: Any) -> None:
        self.encoder, self.passes = encoder, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)

    def encode(self, sentences: list[str]) -> Any:
        counts = Counter(self.encoder.buckets_of(sentences))
        self.passes += sum(math.ceil(n / self.encoder.batch_size) for n in counts.values())
        return self.encoder.encode(sentences)


def timed(check: Callable[[Any], list[str]], encoder: Any) -> tuple[int, float, int]:
    """(passes, seconds, probe rows moved) of one full run of ``check``."""
    counted = PassCounter(encoder)
    start = time.perf_counter()
    found = check(counted)
    return counted.passes, time.perf_counter() - start, len(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="bundle tags")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every-bucket", action="store_true")
    args = parser.parse_args()

    from sentdp.encoders import (
        INVARIANCE_PROBES,
        batch_invariance_violations,
        bucket_probes,
        fixed_batch_violations,
        open_encoder,
    )
    from service.settings import load_settings
    from training.store import load_from_store

    settings = load_settings()

    def swept(encoder: Any, probes: Sequence[str] = INVARIANCE_PROBES) -> list[str]:
        return batch_invariance_violations(encoder, probes, sweep_rows=encoder.batch_size)

    print(f"{'bundle':34s} {'encoder':28s} {'check':22s} {'passes':>6s} {'median s':>9s} moved")
    for model in args.models:
        bundle = load_from_store(model)
        if bundle.encoder_backend == "torch":
            import torch

            torch.set_num_threads(settings.encoder_threads())

        def opened(rows: int, fixed: bool, bundle: Any = bundle) -> Any:
            encoder = open_encoder(
                bundle.encoder_dir,
                bundle.encoder_backend,
                "cpu",
                rows,
                fixed_batch=fixed,
                threads=settings.encoder_threads(),
                onnx_threading=settings.encoder_threading,
                cpu_linear=settings.cpu_linear,
            )
            encoder.encode(["Warm up the encoder."])
            return encoder

        plain = opened(settings.encoder_rows("cpu"), False)
        fixed = opened(settings.fixed_batch_rows("cpu"), True)
        runs: dict[tuple[str, str], list[tuple[int, float, int]]] = {}
        cases = [
            (f"plain buckets of {plain.batch_size}", "mixed, swept", swept, plain),
            (f"fixed passes of {fixed.batch_size}", "mixed, swept (before)", swept, fixed),
            (
                f"fixed passes of {fixed.batch_size}",
                "every layout (now)",
                fixed_batch_violations,
                fixed,
            ),
        ]
        for _ in range(args.repeats):
            for mode, name, check, encoder in cases:
                runs.setdefault((mode, name), []).append(timed(check, encoder))
        medians = {}
        for (mode, name), results in runs.items():
            seconds = statistics.median(r[1] for r in results)
            medians[(mode, name)] = seconds
            moved = max(r[2] for r in results)
            print(f"{model:34s} {mode:28s} {name:22s} {results[0][0]:6d} {seconds:9.2f} {moved}")
        before, now = (medians[(c[0], c[1])] for c in cases[1:])
        print(f"{model:34s} fixed-shape check now / before: {now / before:.2f}")
        if not args.every_bucket:
            continue
        reached = set(plain.buckets_of(list(INVARIANCE_PROBES)))
        for bucket, probe in bucket_probes(plain).items():
            if bucket in reached:
                continue
            for mode, name, check, encoder in (cases[0], cases[2]):
                passes, seconds, moved = timed(functools.partial(check, probes=(probe,)), encoder)
                label = f"{name}, bucket {bucket}"
                print(f"{model:34s} {mode:28s} {label:22s} {passes:6d} {seconds:9.2f} {moved}")


if __name__ == "__main__":
    main()
