"""Documents/second of the DeepCandidate mechanism against two straightforward implementations.

Run: ``.venv/bin/python loadtests/bench_mechanism.py [--m 5000 --p 100 --d 384 --k 30]``

All three run in this one process with the same BLAS thread count, on the same documents:

(a) sentdp: ``DeepCandidate.sample`` / ``sample_batch`` (sorted-merge depth, exact sampler);
(b) NumPy float64 brute force of the m*k*p comparisons with F.V^T precomputed, then a
    softmax draw with ``Generator.choice``;
(c) the same brute-force utilities sampled with ``diffprivlib.mechanisms.Exponential``;
(d) with ``--device cuda``: (a) with its depth computed in torch on that device (the worker's
    choice when its encoder runs on CUDA), and how many documents' utilities it gives exactly
    as the NumPy backend does.

Each figure is the median of several repeats; ratios are against (b).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from sentdp.depth import project
from sentdp.mechanism import DeepCandidate


def load_diffprivlib_exponential() -> Any:
    """diffprivlib 0.6.6's package __init__ imports its sklearn models, which fail against
    scikit-learn 1.9 (``sklearn.tree._tree.DOUBLE`` is gone); load only its mechanisms."""
    spec = importlib.util.find_spec("diffprivlib")
    if spec is None or spec.submodule_search_locations is None:
        raise SystemExit("diffprivlib is not installed: pip install -e '.[eval]'")
    package = types.ModuleType("diffprivlib")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules.setdefault("diffprivlib", package)
    from diffprivlib.mechanisms import Exponential

    return Exponential


def brute_utilities(projected_f: np.ndarray, directions: np.ndarray, doc: np.ndarray) -> np.ndarray:
    ps = doc @ directions.T
    h = (ps[None, :, :] >= projected_f[:, None, :]).sum(axis=1)
    return -np.abs(h - doc.shape[0] / 2).max(axis=1)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info

        return ", ".join(f"{i['internal_api']}={i['num_threads']}" for i in threadpool_info())
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=5000)
    parser.add_argument("--p", type=int, default=100)
    parser.add_argument("--d", type=int, default=384)
    parser.add_argument("--k", type=int, default=30)
    parser.add_argument("--epsilon", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default=None, help="also run the torch depth backend here")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    candidates = rng.standard_normal((args.m, args.d)) * 0.2
    directions = rng.standard_normal((args.p, args.d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    docs = [rng.standard_normal((args.k, args.d)) * 0.3 for _ in range(32)]

    mechanism = DeepCandidate(candidates, directions)
    projected_f = project(candidates, directions)
    exponential = load_diffprivlib_exponential()
    numpy_rng = np.random.default_rng(1)

    def ours_single() -> None:
        for doc in docs[:8]:
            mechanism.sample(doc, args.epsilon)

    def ours_batch() -> None:
        mechanism.sample_batch(docs, [args.epsilon] * len(docs))

    def brute_numpy(batch: list[np.ndarray]) -> None:
        for doc in batch:
            scores = args.epsilon * brute_utilities(projected_f, directions, doc) / 2
            weights = np.exp(scores - scores.max())
            numpy_rng.choice(args.m, p=weights / weights.sum())

    def brute_diffprivlib(batch: list[np.ndarray]) -> None:
        for doc in batch:
            utilities = brute_utilities(projected_f, directions, doc).tolist()
            exponential(epsilon=args.epsilon, sensitivity=1.0, utility=utilities).randomise()

    rows = [
        ("(a) sentdp DeepCandidate", ours_single, ours_batch),
        ("(b) numpy brute force", lambda: brute_numpy(docs[:8]), lambda: brute_numpy(docs)),
        (
            "(c) brute force + diffprivlib",
            lambda: brute_diffprivlib(docs[:8]),
            lambda: brute_diffprivlib(docs),
        ),
    ]
    if args.device:
        on_device = DeepCandidate(candidates, directions, device=args.device)
        same = sum(
            np.array_equal(on_device.utilities(doc), mechanism.utilities(doc)) for doc in docs
        )
        print(f"torch depth on {args.device}: utilities equal NumPy's on {same}/{len(docs)} docs")

        def device_single() -> None:
            for doc in docs[:8]:
                on_device.sample(doc, args.epsilon)

        def device_batch() -> None:
            on_device.sample_batch(docs, [args.epsilon] * len(docs))

        rows.append((f"(d) sentdp, torch depth on {args.device}", device_single, device_batch))
    rates = {}
    for name, single, batch in rows:
        single_rate = 8 / median_seconds(single, args.repeats)
        batch_rate = len(docs) / median_seconds(batch, max(3, args.repeats // 2))
        rates[name] = (single_rate, batch_rate)
    print_table(args, rates)


def print_table(args: argparse.Namespace, rates: dict[str, tuple[float, float]]) -> None:
    """Documents per second of each implementation, and the ratio to the numpy baseline."""
    print(
        f"m={args.m} p={args.p} d={args.d} k={args.k} epsilon={args.epsilon} "
        f"threads: {blas_threads()}; median of {args.repeats} repeats"
    )
    header = ("implementation", "single docs/s", "x (b)", "batch32 docs/s", "x (b)")
    print("{:32s} {:>14s} {:>7s} {:>15s} {:>7s}".format(*header))
    base_single, base_batch = rates["(b) numpy brute force"]
    for name, (single_rate, batch_rate) in rates.items():
        print(
            f"{name:32s} {single_rate:14.1f} {single_rate / base_single:7.2f} "
            f"{batch_rate:15.1f} {batch_rate / base_batch:7.2f}"
        )


if __name__ == "__main__":
    main()
