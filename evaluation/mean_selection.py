"""The bundle's p table against the clipped-mean rule (:mod:`sentdp.mean_selection`) on its
own variants and candidates, by expected validation macro-F1 (exact probabilities, as
training's p table scores them).

Run: ``.venv/bin/python -m evaluation.mean_selection TAG [TAG ...]`` prints, per epsilon of
the bundle's grid, the p table's choice (variant and rule, and its validation figure) and
the best (variant, radius) of the mean rule, the radius being a quantile of the recoded norms
of public training sentences. For bundles trained before format version 6, whose p table
holds Tukey depth only, this is what the mean rule would add. Validation only.
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
from training.p_selection import (
    RADIUS_QUANTILES,
    candidate_confusion,
    radii_of,
    radius_documents,
    soft_macro_f1,
)
from training.settings import load_settings
from training.store import load_from_store


@dataclass(frozen=True)
class Row:
    """One epsilon: the p table's choice and the mean rule's best (variant, radius)."""

    epsilon: float
    table_choice: str
    table_f1: float
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
    public = np.concatenate(radius_documents(embeddings, list(splits.train), splits.seed))
    epsilons = [choice.epsilon for choice in bundle.manifest.p_table]
    best: list[tuple[float, str, float, float]] = [(-1.0, "", 0.0, 0.0)] * len(epsilons)
    for record in bundle.manifest.variants:
        variant = bundle.variant(record.name)
        labels = variant.candidate_labels()
        radii = radii_of(recode(variant.recoder, public), quantiles)
        documents = [recode(variant.recoder, embeddings.document(i)) for i in validation]
        for q, radius in zip(quantiles, radii.values(), strict=True):
            mechanism = MeanCandidate(variant.candidates, radius)
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
            table_choice=choice.describe(),
            table_f1=float(choice.validation_macro_f1 or 0.0),
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
        print("| ε | p table | | clipped mean | |")
        print("|---|---|---|---|---|")
        for row in compare(bundle):
            print(
                f"| {row.epsilon:g} | {row.table_f1:.3f} | {row.table_choice} "
                f"| {row.mean_f1:.3f} | {row.mean_variant}, R = q{row.mean_quantile:g} "
                f"({row.mean_radius:.3g}) |"
            )


if __name__ == "__main__":
    main()
