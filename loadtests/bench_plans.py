"""Planning time per document (everything the worker does between H and the draw) for each
entry of a bundle's p table: Tukey depth and, where the entry names it, the clipped-mean
rule, against the one-level-at-a-time planner the sampler had before its weights were
vectorised (a reference computed in this same process on the same documents).

Run: ``.venv/bin/python loadtests/bench_plans.py TAG [--documents 64 --repeats 7]``

The clipped-mean rule's documents have a level per distinct rounded distance (hundreds for a
variant of 1,476 candidates), where Tukey depth has at most k / 2 + 1, so the per-level cost
of turning weights into thresholds is what this measures. Medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import numpy as np

from evaluation.experiment import embedded_corpus
from sentdp.encoders import recode
from sentdp.mechanism import mechanism_epsilon
from sentdp.sampling import SelectionPlan, plan_levels, plan_selection
from training.settings import load_settings
from training.store import load_from_store


def one_level_at_a_time(deviations: np.ndarray, epsilon: float) -> SelectionPlan:
    """The reference: each level's weight from exact rationals and ``x * 2**1074``."""

    def weights(counts: list[int], level_devs: list[int]) -> list[int]:
        rate = epsilon / 4.0
        num, den = rate.as_integer_ratio()
        out = []
        for count, dev in zip(counts, level_devs, strict=True):
            exact = num * (dev - level_devs[0])
            hi = exact / den
            hi_num, hi_den = hi.as_integer_ratio()
            lo = (exact * hi_den - hi_num * den) / (den * hi_den)
            w_num, w_den = (count * (math.exp(-hi) * (1.0 - lo))).as_integer_ratio()
            out.append(w_num * ((1 << 1074) // w_den))
        return out

    return plan_levels(deviations, weights)


def planner(
    plan: Callable[[np.ndarray, float], SelectionPlan], deviations: list[np.ndarray], epsilon: float
) -> Callable[[], list[SelectionPlan]]:
    return lambda: [plan(d, epsilon) for d in deviations]


def median_ms(run: Callable[[], object], documents: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / documents * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag", help="a bundle in the BentoML store")
    parser.add_argument("--documents", type=int, default=64, help="validation documents")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    bundle = load_from_store(args.tag)
    _, splits, _, embeddings = embedded_corpus(bundle, load_settings())
    chosen = list(splits.validation)[: args.documents]
    print(f"{bundle.manifest.name}: planning ms per document ({len(chosen)} validation documents)")
    print("| ε | variant (m) | rule | median levels | planned | one level at a time | ratio |")
    print("|---|---|---|---|---|---|---|")
    for choice in bundle.manifest.p_table:
        variant = bundle.variant(choice.variant)
        documents = [recode(variant.recoder, embeddings.document(i)) for i in chosen]
        if choice.radius is not None:
            mean = variant.mean_mechanism(choice.radius)
            deviations = [mean.deviations(d) for d in documents]
            run_at = mean.plan_epsilon(choice.epsilon)
        else:
            utilities = variant.mechanism().utilities_batch(documents, [choice.p] * len(documents))
            deviations = [np.rint(-2.0 * u).astype(np.int64) for u in utilities]
            run_at = mechanism_epsilon(choice.epsilon, variant.record.candidates)
        plans = [plan_selection(d, run_at) for d in deviations]
        reference = [one_level_at_a_time(d, run_at) for d in deviations]
        assert all(p.thresholds == r.thresholds for p, r in zip(plans, reference, strict=True))
        fast = median_ms(planner(plan_selection, deviations, run_at), len(chosen), args.repeats)
        slow = median_ms(
            planner(one_level_at_a_time, deviations, run_at), len(chosen), args.repeats
        )
        levels = statistics.median(len(p.counts) for p in plans)
        rule = "Tukey depth" if choice.radius is None else "clipped mean"
        print(
            f"| {choice.epsilon:g} | {choice.variant} ({variant.record.candidates}) | {rule} "
            f"| {levels:g} | {fast:.3f} | {slow:.3f} | {slow / fast:.1f}x |"
        )


if __name__ == "__main__":
    main()
