"""Choose the number of directions p for every epsilon of a grid, on the validation split.

The criterion is the macro-F1 of the *expected* confusion matrix: each validation document
contributes the exact probability (from :func:`~sentdp.mechanism.selection_log_probs`) with
which the mechanism would pick a candidate of each class. It is deterministic, free of
sampling noise and close to the mean macro-F1 over many runs, so re-running training gives
identical choices and figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sentdp.bundle import PChoice
from sentdp.mechanism import DeepCandidate, selection_log_probs

DEFAULT_EPSILONS = (1.0, 3.0, 6.0, 10.0, 23.0, 50.0)
DEFAULT_PS = tuple(range(10, 101, 10))


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


def soft_macro_f1(confusion: npt.NDArray[np.float64]) -> float:
    tp = np.diag(confusion)
    denominator = confusion.sum(axis=0) + confusion.sum(axis=1)
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)
    return float(f1.mean())


@dataclass(frozen=True)
class Option:
    """One variant to choose from: its mechanism, the validation documents in its space (G'),
    and the class each of its candidates stands for."""

    variant: str
    mechanism: DeepCandidate
    documents: Sequence[npt.NDArray[np.float64]]
    candidate_labels: npt.NDArray[np.int64]
    ps: Sequence[int] = DEFAULT_PS


def choose_p(
    options: Sequence[Option],
    truth: Sequence[int],
    n_classes: int,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
) -> tuple[list[PChoice], dict[str, dict[str, list[float]]]]:
    """For every epsilon, the (variant, p) with the best expected validation macro-F1.

    Ties go to the earlier variant, then the smaller p. Also returns every score, as
    ``scores[variant][p] = [macro-F1 per epsilon]``.
    """
    scores: dict[str, dict[str, list[float]]] = {}
    candidates: list[tuple[int, str, int]] = []
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
            candidates.append((rank, option.variant, p))
    choices = []
    for column, epsilon in enumerate(epsilons):
        rank, variant, p = max(
            candidates, key=lambda c: (scores[c[1]][str(c[2])][column], -c[0], -c[2])
        )
        choices.append(
            PChoice(
                epsilon=epsilon,
                variant=variant,
                p=p,
                validation_macro_f1=scores[variant][str(p)][column],
            )
        )
    return choices, scores
