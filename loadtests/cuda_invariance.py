"""Does batching move a sentence's embedding on this device? The worker's start-up check in full.

Run: ``python loadtests/cuda_invariance.py [--model TAG] [--device cuda] [--sentences 500]``

For each mode the worker can serve in on the device (plain length buckets; fixed-shape
batches with deterministic kernels, eager or replayed as CUDA graphs), on the bundle's own
encoder:

1. the start-up check without stopping at the first violation (plain buckets: every probe,
   mixed and same-bucket batches of 2 to 64 rows, every row count of one bucket swept; fixed
   shapes: every count of real rows and position of a pass in the probes' buckets): how many
   rows differ from the probe encoded alone, and by how much at most;
2. real BBC News test sentences encoded all at once against one at a time: rows not
   bit-identical (the property the privacy proof needs, on real text).

Also: the device's embeddings against the CPU's and against sentence-transformers' on the same
device (information only: each is a function of the sentence alone; they need not agree).
Deterministic kernels stay on in the process once set, so the bucket mode runs first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def real_sentences(count: int) -> list[str]:
    """The first ``count`` sentences of the BBC News test split."""
    from loadtests.bench_service import bbc_test_split

    return [s for document in bbc_test_split() for s in document][:count]


def check(encoder, sentences: list[str]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    from sentdp.encoders import batch_invariance_violations, fixed_batch_violations

    start = time.perf_counter()
    if encoder.fixed_batch:
        found = fixed_batch_violations(encoder)
    else:
        found = batch_invariance_violations(encoder, sweep_rows=encoder.batch_size)
    seconds = time.perf_counter() - start
    deltas = [float(line.rsplit(": ", 1)[1]) for line in found]
    together = encoder.encode(sentences)
    alone = np.stack([encoder.encode([s])[0] for s in sentences])
    moved = np.any(together != alone, axis=1)
    return {
        "probe rows moved": len(found),
        "max probe delta": max(deltas, default=0.0),
        "check s": seconds,
        "real rows moved": int(moved.sum()),
        "max real delta": float(np.abs(together - alone).max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sentdp-bbc-news:latest")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sentences", type=int, default=500)
    args = parser.parse_args()

    import torch

    from sentdp.encoders import INVARIANCE_PROBES, open_encoder, use_deterministic_kernels
    from service.settings import load_settings
    from training.store import load_from_store

    bundle = load_from_store(args.model)
    rows = load_settings().encoder_rows(args.device)
    sentences = real_sentences(args.sentences)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(
        f"{args.model} ({bundle.encoder_backend}) on {args.device} ({name}), torch "
        f"{torch.__version__}, {rows} rows per pass, {len(sentences)} real sentences"
    )

    probes = list(INVARIANCE_PROBES)
    results = {}
    served: dict[bool, np.ndarray] = {}
    buckets = open_encoder(bundle.encoder_dir, bundle.encoder_backend, args.device, rows)
    print(
        f"encoder class {type(buckets).__name__}, own torch pass: "
        f"{getattr(buckets, '_bert', None) is not None}"
    )
    results["length buckets"] = check(buckets, sentences)
    on_device = np.stack([buckets.encode([p])[0] for p in probes])

    from sentence_transformers import SentenceTransformer

    plain = SentenceTransformer(str(bundle.encoder_dir), device=args.device, local_files_only=True)
    st = np.stack([plain.encode([p])[0] for p in probes])
    on_cpu = open_encoder(bundle.encoder_dir, bundle.encoder_backend, "cpu", 32)
    cpu = np.stack([on_cpu.encode([p])[0] for p in probes])
    del buckets, plain

    use_deterministic_kernels()
    for graphs in (False, True):
        fixed = open_encoder(
            bundle.encoder_dir, bundle.encoder_backend, args.device, rows, True, cuda_graphs=graphs
        )
        mode = "fixed batches, deterministic" + (", CUDA graphs" if graphs else ", eager")
        results[mode] = check(fixed, sentences)
        served[graphs] = fixed.encode(sentences)

    columns = list(next(iter(results.values())))
    print(f"{'mode':44s} " + " ".join(f"{c:>16s}" for c in columns))
    for mode, result in results.items():
        cells = " ".join(
            f"{v:16d}" if isinstance(v, int) else f"{v:16.3g}" for v in result.values()
        )
        print(f"{mode:44s} {cells}")
    same = int(np.all(served[False] == served[True], axis=1).sum())
    print(
        f"real sentences, CUDA graphs against eager fixed batches: {same}/{len(sentences)} "
        "rows bit-identical"
    )
    print(
        f"probes alone, {args.device} vs the CPU: max |diff| "
        f"{float(np.abs(on_device - cpu).max()):.3g}"
    )
    print(
        f"probes alone, sentdp's encoder vs sentence-transformers on {args.device}: "
        f"max |diff| {float(np.abs(on_device - st).max()):.3g}, bit-identical rows "
        f"{int(np.all(on_device == st, axis=1).sum())}/{len(probes)}"
    )


if __name__ == "__main__":
    main()
