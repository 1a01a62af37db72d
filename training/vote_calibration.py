"""Votes calibrated through the mechanism: per class, a scale and an offset of the vote's
logits, fitted for the private label at one epsilon.

The logistic regressions of :mod:`training.label_vote` fit each sentence alone, labelled with
its document's class, and one temperature is shared by every class. What the service draws
from is the tally of a document's votes through permute-and-flip at epsilon, and classes
differ in how often their sentences tell them apart. This step fits ``r`` scales and ``r``
offsets of a fit's logits (``l'_c = s_c l_c + o_c``) by following the gradient of the soft
macro-F1 of that draw's probabilities, the criterion validation chooses by: a sentence's
cube vote is ``exp(l'_c - l'_max)`` before the floor, and permute-and-flip's probabilities
come from the same Gauss-Legendre integral as :func:`sentdp.labels.vote_probabilities` (the
exponential mechanism's above :data:`~sentdp.labels.FLIP_MAX_CLASSES` classes).

The logits it is fitted on are out of fold: each training document's sentences are scored by
the same family refitted on the other folds, so the calibration sees votes as confident as
they are on unseen documents (refitting every weight on the training documents' own votes
overfitted them: on clothing reviews' validation at epsilon 3, 0.420 -> 0.410; these 2r
numbers gained, 0.420 -> 0.441).

The result is the same kind of vote: a linear classifier of one sentence, its weights and
bias scaled and shifted per class, fitted on public training documents only, so the
mechanism and its privacy are unchanged. Validation chooses it, or not, like any other fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sentdp.labels import FLIP_MAX_CLASSES, SentenceVote, vote_epsilon
from sentdp.sampling import GAMMA
from training.embeddings import CorpusEmbeddings

if TYPE_CHECKING:
    import torch

FOLDS = 5
"""Folds of the training documents for the out-of-fold logits."""
STEPS = 300
"""Full-batch Adam steps."""
RATE = 0.02
"""Adam's step size (on the scales, which start at 1 / temperature, and the offsets)."""

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FoldLogits:
    """Every training document's sentences' logits from a fit that did not see it."""

    logits: FloatArray
    """(k, r), the documents' sentences stacked."""
    segments: npt.NDArray[np.int64]
    """(k,) the index (into ``truth``) of each row's document."""
    truth: npt.NDArray[np.int64]
    """(N,) each document's class."""


def out_of_fold_logits(
    fit_on: Callable[[Sequence[int]], SentenceVote],
    embeddings: CorpusEmbeddings,
    y: npt.NDArray[np.int64],
    train: Sequence[int],
    seed: int,
    texts: Sequence[Sequence[str]] | None = None,
) -> FoldLogits:
    """``fit_on(documents)`` refitted on all folds but one, for each of :data:`FOLDS` seeded
    folds of ``train``; each document's logits from the fit that left its fold out. The folds
    are stratified (each class's documents dealt round the folds in a seeded order), so every
    fit sees every class that has two training documents or more."""
    order = np.random.default_rng(seed).permutation(np.asarray(train, dtype=np.int64))
    order = order[np.argsort(np.asarray(y)[order], kind="stable")]
    folds = [order[k::FOLDS] for k in range(FOLDS)]
    logits: dict[int, FloatArray] = {}
    for k, fold in enumerate(folds):
        vote = fit_on(sorted(int(i) for j, f in enumerate(folds) if j != k for i in f))
        for i in fold:
            text = None if texts is None else texts[int(i)]
            logits[int(i)] = vote.logits(embeddings.document(int(i)), text)
    documents = sorted(logits)
    return FoldLogits(
        np.concatenate([logits[i] for i in documents]),
        np.repeat(np.arange(len(documents)), [len(logits[i]) for i in documents]),
        np.asarray(y, dtype=np.int64)[documents],
    )


def calibrate(
    fold: FoldLogits, temperature: float, epsilon: float
) -> tuple[FloatArray, FloatArray]:
    """Per-class scales (starting at ``1 / temperature``) and offsets (starting at 0) of the
    logits that maximise the cube vote's soft macro-F1 at ``epsilon`` over ``fold``."""
    import torch

    classes = fold.logits.shape[1]
    logits = torch.as_tensor(fold.logits, dtype=torch.float64)
    segments = torch.as_tensor(fold.segments)
    truth = torch.as_tensor(fold.truth)
    scale = torch.full((classes,), 1.0 / temperature, dtype=torch.float64, requires_grad=True)
    offset = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    probabilities = _selection(epsilon, classes)
    optimiser = torch.optim.Adam([scale, offset], lr=RATE)
    for _ in range(STEPS):
        optimiser.zero_grad()
        shifted = logits * scale + offset
        votes = torch.exp(shifted - shifted.max(dim=1, keepdim=True).values)
        tallies = torch.zeros(len(fold.truth), classes, dtype=torch.float64)
        tallies = tallies.index_add(0, segments, votes)
        confusion = torch.zeros(classes, classes, dtype=torch.float64)
        confusion = confusion.index_add(0, truth, probabilities(tallies))
        (-_soft_macro_f1(confusion)).backward()  # type: ignore[no-untyped-call]
        optimiser.step()
    return scale.detach().numpy().copy(), offset.detach().numpy().copy()


def calibrated(vote: SentenceVote, scale: FloatArray, offset: FloatArray) -> SentenceVote:
    """``vote`` (unscaled) with logit ``c`` scaled by ``scale[c]`` and shifted by
    ``offset[c]``, voting in the cube."""
    words = None if vote.word_weights is None else vote.word_weights * scale[:, None]
    return SentenceVote(
        vote.weights * scale[:, None], vote.bias * scale + offset, words, vote.words, shape="cube"
    )


def _selection(epsilon: float, classes: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The vote's probabilities from (N, r) continuous tallies in sentence units, in torch:
    permute-and-flip (the exponential mechanism above FLIP_MAX_CLASSES), then the floor."""
    import torch

    rate = vote_epsilon(epsilon, classes) / 2.0
    nodes, weights = np.polynomial.legendre.leggauss(classes // 2 + 1)
    x = torch.as_tensor((nodes + 1.0) / 2.0)
    w = torch.as_tensor(weights / 2.0)

    def probabilities(tallies: torch.Tensor) -> torch.Tensor:
        behind = tallies.max(dim=1, keepdim=True).values - tallies
        if classes > FLIP_MAX_CLASSES:
            mechanism = torch.softmax(-rate * behind, dim=1)
        else:
            a = torch.exp(-rate * behind)
            factors = 1.0 - a[:, :, None] * x[None, None, :]
            mechanism = a * ((factors.prod(dim=1, keepdim=True) / factors) @ w)
        return (1.0 - GAMMA) * mechanism + GAMMA / classes

    return probabilities


def _soft_macro_f1(confusion: torch.Tensor) -> torch.Tensor:
    """:func:`training.p_selection.soft_macro_f1` in torch (differentiable)."""
    tp = confusion.diagonal()
    denominator = confusion.sum(dim=0) + confusion.sum(dim=1)
    return (2 * tp / denominator.clamp_min(1e-12)).mean()
