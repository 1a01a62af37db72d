"""DeepCandidate's Tukey depth against the clipped-mean rule (:mod:`sentdp.mean_selection`)
on a bundle's own variants and candidates, by expected validation macro-F1 (exact
probabilities, as training's p table scores them).

Run: ``.venv/bin/python -m evaluation.mean_selection TAG [TAG ...]`` prints, per epsilon of
the bundle's grid, the p table's choice (variant, p and its validation figure) and the best
(variant, radius) of the mean rule, the radius being a quantile of the recoded norms of
public training sentences. Validation only: the rule is not in bundles yet, so nothing is
chosen on, or reported for, the test split.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evaluation.experiment import embedded_corpus
from sentdp.bundle import Bundle
from sentdp.encoders import recode
from sentdp.mean_selection import MeanCandidate
from training.p_selection import candidate_confusion, soft_macro_f1
from training.settings import load_settings
from training.store import load_from_store

RADIUS_QUANTILES = (0.25, 0.5, 0.75, 0.9)
RADIUS_DOCUMENTS = 2000
"""Training documents whose recoded sentence norms give the radii (public data)."""


@dataclass(frozen=True)
class Row:
    """One epsilon: the p table's choice and the mean rule's best (variant, radius)."""

    epsilon: float
    depth_variant: str
    depth_p: int
    depth_f1: float
    mean_variant: str
    mean_quantile: float
    mean_radius: float
    mean_f1: float


def compare(bundle: Bundle, quantiles: Sequence[float] = RADIUS_QUANTILES) -> list[Row]:
    """One row per epsilon of the bundle's p table."""
    settings = load_settings()
    corpus, splits, _, embeddings = embedded_corpus(bundle, settings)
    class_of = {label: i for i, label in enumerate(corpus.labels)}
    validation = list(splits.validation)
    truth = [class_of[corpus.documents[i].label] for i in validation]
    public = list(splits.train)[:RADIUS_DOCUMENTS]
    epsilons = [choice.epsilon for choice in bundle.manifest.p_table]
    best: list[tuple[float, str, float, float]] = [(-1.0, "", 0.0, 0.0)] * len(epsilons)
    for record in bundle.manifest.variants:
        variant = bundle.variant(record.name)
        labels = variant.candidate_labels()
        norms = np.concatenate(
            [
                np.linalg.norm(recode(variant.recoder, embeddings.document(i)), axis=1)
                for i in public
            ]
        )
        documents = [recode(variant.recoder, embeddings.document(i)) for i in validation]
        for q in quantiles:
            mechanism = MeanCandidate(variant.candidates, float(np.quantile(norms, q)))
            deviations = [mechanism.deviations(d) for d in documents]
            for column, epsilon in enumerate(epsilons):
                probabilities = (np.exp(mechanism.log_probs_for(d, epsilon)) for d in deviations)
                confusion = candidate_confusion(probabilities, truth, labels, len(corpus.labels))
                score = soft_macro_f1(confusion)
                if score > best[column][0]:
                    best[column] = (score, record.name, q, mechanism.radius)
    return [
        Row(
            epsilon=choice.epsilon,
            depth_variant=choice.variant,
            depth_p=choice.p,
            depth_f1=float(choice.validation_macro_f1 or 0.0),
            mean_variant=best[column][1],
            mean_quantile=best[column][2],
            mean_radius=best[column][3],
            mean_f1=best[column][0],
        )
        for column, choice in enumerate(bundle.manifest.p_table)
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tags", nargs="+", help="bundles in the BentoML store")
    args = parser.parse_args(argv)
    for tag in args.tags:
        bundle = load_from_store(tag)
        print(f"\n{bundle.manifest.name}: expected validation macro-F1")
        print("| ε | Tukey depth (p table) | | clipped mean | |")
        print("|---|---|---|---|---|")
        for row in compare(bundle):
            print(
                f"| {row.epsilon:g} | {row.depth_f1:.3f} | {row.depth_variant}, p = {row.depth_p} "
                f"| {row.mean_f1:.3f} | {row.mean_variant}, R = q{row.mean_quantile:g} "
                f"({row.mean_radius:.3g}) |"
            )


if __name__ == "__main__":
    main()
