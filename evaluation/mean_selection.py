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

from evaluation.experiment import embedded_corpus
from sentdp.bundle import Bundle
from sentdp.encoders import recode
from training.p_selection import RADIUS_QUANTILES, Option, choose_p, radii_of, radius_sentences
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
    """One row per epsilon of the bundle's p table; the mean rule scored and chosen by
    training's own :func:`~training.p_selection.choose_p` (no ps: the mean rule only)."""
    corpus, splits, _, embeddings = embedded_corpus(bundle, load_settings())
    class_of = {label: i for i, label in enumerate(corpus.labels)}
    validation = list(splits.validation)
    truth = [class_of[corpus.documents[i].label] for i in validation]
    public = radius_sentences(embeddings, list(splits.train), splits.seed)
    options = []
    quantile_of: dict[tuple[str, float], float] = {}  # (variant, radius) -> its first quantile
    for variant in bundle.variants:
        radii = radii_of(recode(variant.recoder, public), quantiles)
        for q, radius in zip(quantiles, radii.values(), strict=True):
            quantile_of.setdefault((variant.record.name, radius), q)
        options.append(
            Option(
                variant=variant.record.name,
                mechanism=variant.mechanism(),
                documents=[recode(variant.recoder, embeddings.document(i)) for i in validation],
                candidate_labels=variant.candidate_labels(),
                ps=(),
                means={name: variant.mean_mechanism(radius) for name, radius in radii.items()},
            )
        )
    epsilons = [choice.epsilon for choice in bundle.manifest.p_table]
    best, _ = choose_p(options, truth, len(corpus.labels), epsilons)
    return [
        Row(
            epsilon=choice.epsilon,
            table_choice=choice.describe(),
            table_f1=float(choice.validation_macro_f1 or 0.0),
            mean_variant=mean.variant,
            mean_quantile=quantile_of[mean.variant, float(mean.radius or 0.0)],
            mean_radius=float(mean.radius or 0.0),
            mean_f1=float(mean.validation_macro_f1 or 0.0),
        )
        for choice, mean in zip(bundle.manifest.p_table, best, strict=True)
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
