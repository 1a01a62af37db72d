"""SentenceVote's two vote shapes compared on one classifier: expected macro-F1.

A vote's tallies have sensitivity U = :data:`sentdp.labels.VOTE_UNITS` per class. A simplex
vote (``floor(U * softmax)``) sums to at most U; a cube vote (``floor(U * exp(l_c - l_max))``,
:attr:`sentdp.labels.SentenceVote.shape`) gives the sentence's likeliest class U and every
other class U times its probability relative to the likeliest. Training chooses the shape per
epsilon with the rest of the vote (:mod:`training.label_vote`); this holds everything else
fixed (vote 0's classifier, its temperature scaled by each factor) to show what the shape
alone does. Simplex votes are drawn as the bundle draws them (by sentence count where it
does), cube votes by permute-and-flip (the count rule is proven for the simplex only).

Run: ``.venv/bin/python -m evaluation.vote_shape TAG [TAG ...]``: per bundle and epsilon, vote
0's classifier at temperatures scaled by each factor, in both shapes (simplex drawn as the
bundle draws it), the factor chosen on validation and its test figure. Exact probabilities,
no sampling noise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from evaluation.experiment import embedded_corpus
from evaluation.tables import bundles, print_table, tag_parser
from evaluation.vote_selection import split_documents
from sentdp.bundle import Bundle
from sentdp.labels import VOTE_SHAPES
from training.p_selection import DEFAULT_EPSILONS, soft_macro_f1
from training.settings import load_settings

SHAPES = VOTE_SHAPES
FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Temperature factors on vote 0's own temperature."""


def compare_shapes(
    bundle: Bundle,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    factors: Sequence[float] = FACTORS,
) -> dict[tuple[str, str, float, float], float]:
    """Expected macro-F1 by (split, shape, factor, epsilon) of vote 0 at its temperature times
    ``factor``: simplex votes drawn by the bundle's rule (by sentence count where it makes
    votes that way), cube votes by permute-and-flip."""
    if not bundle.votes:
        raise ValueError(f"{bundle.manifest.name} has no SentenceVote")
    corpus, splits, _, embeddings = embedded_corpus(bundle, load_settings())
    scores: dict[tuple[str, str, float, float], float] = {}
    for split in ("validation", "test"):
        texts, vectors, truth = split_documents(corpus, splits, embeddings, split)
        for factor in factors:
            for shape in SHAPES:
                vote = bundle.votes[0].scaled(factor).shaped(shape)
                if shape == "simplex":
                    vote = vote.counted(bundle.manifest.vote_by_count)
                deviations = [vote.deviations(x, t) for x, t in zip(vectors, texts, strict=True)]
                for epsilon in epsilons:
                    confusion = np.zeros((vote.classes, vote.classes))
                    for devs, label, t in zip(deviations, truth, texts, strict=True):
                        confusion[label] += np.exp(vote.log_probs_for(devs, epsilon, len(t)))
                    scores[(split, shape, factor, epsilon)] = soft_macro_f1(confusion)
    return scores


def chosen(
    scores: dict[tuple[str, str, float, float], float], shape: str, epsilon: float
) -> tuple[float, float, float]:
    """(factor, validation, test) of the factor with the best validation score."""
    factors = sorted({f for (_, s, f, e) in scores if s == shape and e == epsilon})
    best = max(factors, key=lambda f: scores[("validation", shape, f, epsilon)])
    return (
        best,
        scores[("validation", shape, best, epsilon)],
        scores[("test", shape, best, epsilon)],
    )


def main() -> None:
    args = tag_parser("python -m evaluation.vote_shape").parse_args()
    header = ["ε", "simplex: factor, validation, test", "cube: factor, validation, test"]
    for bundle in bundles(args.tags):
        scores = compare_shapes(bundle)
        rows = [
            [f"{epsilon:g}"]
            + [
                f"x{f:g}, {v:.3f}, {t:.3f}"
                for f, v, t in (chosen(scores, s, epsilon) for s in SHAPES)
            ]
            for epsilon in DEFAULT_EPSILONS
        ]
        title = f"{bundle.manifest.name} ({bundle.votes[0].classes} classes; vote 0)"
        print_table(title, header, rows)


if __name__ == "__main__":
    main()
