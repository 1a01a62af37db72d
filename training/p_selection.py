"""Choose the variant and selection rule (Tukey depth with p directions, or distance to the
clipped mean at a radius R) for every epsilon of a grid, on the validation split.

The criterion is the macro-F1 of the *expected* confusion matrix: each validation document
contributes the exact probability (from :func:`~sentdp.mechanism.selection_log_probs`) with
which the mechanism would pick a candidate of each class. It is deterministic, free of
sampling noise and close to the mean macro-F1 over many runs, so re-running training gives
identical choices and figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp.bundle import PChoice
from sentdp.mean_selection import RADII, MeanCandidate
from sentdp.mechanism import DeepCandidate, selection_log_probs
from training.embeddings import CorpusEmbeddings

DEFAULT_EPSILONS = (1.0, 3.0, 6.0, 10.0, 23.0, 50.0)
DEFAULT_PS = tuple(range(10, 101, 10))
RADIUS_QUANTILES = (0.25, 0.5, 0.75, 0.9)
"""The mean rule's radii: quantiles of public training sentences' recoded norms."""


def expected_confusion(
    utilities: Sequence[npt.NDArray[np.float64]],
    truth: Sequence[int],
    candidate_labels: npt.NDArray[np.int64],
    n_classes: int,
    epsilon: float,
) -> npt.NDArray[np.float64]:
    """(r, r) matrix: row = true class, column = expected count of each predicted class."""
    probabilities = (np.exp(selection_log_probs(u, epsilon)) for u in utilities)
    return candidate_confusion(probabilities, truth, candidate_labels, n_classes)


def candidate_confusion(
    probabilities: Iterable[npt.NDArray[np.float64]],
    truth: Sequence[int],
    candidate_labels: npt.NDArray[np.int64],
    n_classes: int,
) -> npt.NDArray[np.float64]:
    """The expected confusion matrix of documents drawing candidates with these
    ``probabilities``, each candidate standing for its class in ``candidate_labels``."""
    confusion = np.zeros((n_classes, n_classes))
    for probs, label in zip(probabilities, truth, strict=True):
        confusion[label] += np.bincount(candidate_labels, weights=probs, minlength=n_classes)
    return confusion


RADIUS_DOCUMENTS = 2000
"""Public training documents whose recoded sentence norms give the mean rule's radii."""


def radius_sentences(
    embeddings: CorpusEmbeddings, train: Sequence[int], seed: int
) -> npt.NDArray[np.floating[Any]]:
    """The G embeddings of the sentences of up to :data:`RADIUS_DOCUMENTS` training documents
    (a seeded sample, in corpus order), one row each."""
    chosen = np.random.default_rng(seed).permutation(np.asarray(train))[:RADIUS_DOCUMENTS]
    return np.concatenate([embeddings.document(int(i)) for i in sorted(chosen)])


def radii_of(
    sentences: npt.NDArray[np.float64], quantiles: Sequence[float] = RADIUS_QUANTILES
) -> dict[str, float]:
    """The mean rule's radii to try, by name ("q0.5"): quantiles of the norms of public
    (recoded) training sentences, each kept inside the rule's range of radii."""
    norms = np.linalg.norm(np.asarray(sentences, dtype=np.float64), axis=1)
    low, high = RADII
    return {f"q{q:g}": float(np.clip(np.quantile(norms, q), low, high)) for q in quantiles}


def soft_macro_f1(confusion: npt.NDArray[np.float64]) -> float:
    tp = np.diag(confusion)
    denominator = confusion.sum(axis=0) + confusion.sum(axis=1)
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)
    return float(f1.mean())


@dataclass(frozen=True)
class Option:
    """One variant to choose from: its mechanism, the validation documents in its space (G'),
    the class each of its candidates stands for, the ps to try, and the mean rule over the
    same candidates at each radius to try, by the radius's name such as "q0.5" (none: Tukey
    depth only)."""

    variant: str
    mechanism: DeepCandidate
    documents: Sequence[npt.NDArray[np.float64]]
    candidate_labels: npt.NDArray[np.int64]
    ps: Sequence[int] = DEFAULT_PS
    means: Mapping[str, MeanCandidate] = field(default_factory=dict)


MEAN = "mean "
"""Prefix of the mean rule's score keys: ``scores[variant]["mean q0.5"]``."""


def choose_p(
    options: Sequence[Option],
    truth: Sequence[int],
    n_classes: int,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
) -> tuple[list[PChoice], dict[str, dict[str, list[float]]]]:
    """For every epsilon, the (variant, rule) with the best expected validation macro-F1.

    Ties go to the earlier variant, then to Tukey depth (the paper's rule), then the smaller
    p or the earlier radius. Also returns every score, as ``scores[variant][key] = [macro-F1
    per epsilon]``, the key being p, or :data:`MEAN` and the radius's name.
    """
    scores: dict[str, dict[str, list[float]]] = {}
    # (rank, variant, tie-break within the variant, score key, the choice without epsilon)
    entries: list[tuple[int, str, int, str, dict[str, object]]] = []
    for rank, option in enumerate(options):
        usable = sorted({min(p, option.mechanism.p_max) for p in option.ps})
        scores[option.variant] = {}
        for p in usable:
            utilities = option.mechanism.utilities_batch(
                option.documents, [p] * len(option.documents)
            )
            scores[option.variant][str(p)] = [
                soft_macro_f1(
                    expected_confusion(
                        utilities, truth, option.candidate_labels, n_classes, epsilon
                    )
                )
                for epsilon in epsilons
            ]
            entries.append((rank, option.variant, p, str(p), {"p": p}))
        for order, (name, mean) in enumerate(option.means.items()):
            deviations = [mean.deviations(d) for d in option.documents]
            key = MEAN + name
            scores[option.variant][key] = [
                soft_macro_f1(
                    candidate_confusion(
                        (np.exp(mean.log_probs_for(d, epsilon)) for d in deviations),
                        truth,
                        option.candidate_labels,
                        n_classes,
                    )
                )
                for epsilon in epsilons
            ]
            rule = {"p": 1, "selection": "mean", "radius": mean.radius}
            entries.append((rank, option.variant, 10**9 + order, key, rule))
    choices = []
    for column, epsilon in enumerate(epsilons):
        _, variant, _, key, rule = max(
            entries, key=lambda e: (scores[e[1]][e[3]][column], -e[0], -e[2])
        )
        choices.append(
            PChoice.model_validate(
                {
                    "epsilon": epsilon,
                    "variant": variant,
                    "validation_macro_f1": scores[variant][key][column],
                    **rule,
                }
            )
        )
    return choices, scores
