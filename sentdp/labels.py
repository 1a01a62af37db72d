"""SentenceVote: a private class label straight from the sentences, over r outcomes only.

Each sentence votes through a public per-sentence classifier: a softmax over the r classes,
quantized to integers ``q_c(s) = floor(VOTE_UNITS * softmax_c(s))`` in ``[0, VOTE_UNITS]``.
Class c's tally is ``n_c = sum_s q_c(s)``. Replacing one sentence moves every tally by at most
``VOTE_UNITS`` (a vote depends on its own sentence only: logits are computed row by row by
:func:`sentdp.depth.project`), so the exponential mechanism with
``P(c) proportional to exp(eps' * n_c / (2 * VOTE_UNITS))`` is eps'-SentDP. It runs through the
same floor-safe sampler as DeepCandidate, at ``eps' = epsilon - eta(r)``, so the guarantee is
exactly the epsilon charged.

Why: DeepCandidate chooses among m candidates, so at small epsilon its choice is spread over
many of them (the exponential mechanism's utility gap grows with ln m); a label needs only r
outcomes, and a sentence's vote is bounded in [0, 1] per class however unusual it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sentdp.depth import project
from sentdp.errors import InputError
from sentdp.mechanism import DeepCandidate, mechanism_epsilon
from sentdp.sampling import GAMMA, RandomBytes, SelectionPlan, plan_selection

VOTE_UNITS = 64
"""A sentence's vote for one class is an integer in [0, VOTE_UNITS] (its probability, floored)."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class SentenceVote:
    """The label mechanism: a public linear per-sentence classifier ``softmax(x W^T + b)``
    over sentence embeddings x (the encoder's G, before any recoding)."""

    weights: FloatArray
    """(r, d) float64."""
    bias: FloatArray
    """(r,) float64."""

    def __post_init__(self) -> None:
        w, b = np.asarray(self.weights), np.asarray(self.bias)
        if w.ndim != 2 or b.shape != (w.shape[0],) or w.shape[0] < 2:
            raise InputError(f"a vote needs (r, d) weights and (r,) bias, r >= 2; got {w.shape}")
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise InputError("the vote classifier's weights must be finite")

    @property
    def classes(self) -> int:
        return int(self.weights.shape[0])

    def votes(self, sentences: npt.ArrayLike) -> IntArray:
        """(k, r) integer votes in [0, VOTE_UNITS], each row a function of its sentence alone."""
        x = np.asarray(sentences, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] != self.weights.shape[1]:
            raise InputError(
                f"sentences must be a non-empty (k, {self.weights.shape[1]}) array, "
                f"got shape {x.shape}"
            )
        if not np.isfinite(x).all():
            raise InputError("sentence embeddings must be finite (no NaN or infinity)")
        logits = project(x, self.weights) + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        votes: IntArray = np.clip(np.floor(probs * VOTE_UNITS), 0, VOTE_UNITS).astype(np.int64)
        return votes

    def deviations(self, sentences: npt.ArrayLike) -> IntArray:
        """(r,) ``max_c n_c - n_c``: how far each class's tally is behind the leader's."""
        tallies = self.votes(sentences).sum(axis=0)
        deviations: IntArray = tallies.max() - tallies
        return deviations

    def log_probs(self, sentences: npt.ArrayLike, epsilon: float) -> FloatArray:
        """(r,) natural-log probabilities with which :meth:`sample` picks each class."""
        return vote_log_probs(self.deviations(sentences), epsilon)

    def plan_batch(
        self, documents: Sequence[npt.ArrayLike], epsilons: Sequence[float]
    ) -> list[SelectionPlan]:
        """Every document's selection plan; validates everything and draws no randomness."""
        if len(epsilons) != len(documents):
            raise InputError(f"got {len(documents)} documents but {len(epsilons)} epsilons")
        return [
            vote_plan(self.deviations(doc), eps)
            for doc, eps in zip(documents, epsilons, strict=True)
        ]

    def sample_batch(
        self,
        documents: Sequence[npt.ArrayLike],
        epsilons: Sequence[float],
        rng: RandomBytes | None = None,
    ) -> IntArray:
        """One private class index per document (epsilon-SentDP each)."""
        return DeepCandidate.draw_plans(self.plan_batch(documents, epsilons), rng)


def sampler_epsilon(epsilon: float, classes: int) -> float:
    """The rate to give :func:`~sentdp.sampling.plan_selection` (which weighs a level by
    ``exp(-rate * dev / 4)``) so that a class is weighed by ``exp(eps' * n_c / (2 U))``,
    with ``eps' = epsilon - eta(r)`` and U = :data:`VOTE_UNITS`."""
    return 2.0 * mechanism_epsilon(epsilon, classes) / VOTE_UNITS


def vote_plan(deviations: IntArray, epsilon: float) -> SelectionPlan:
    """The sampler's plan for a vote's ``deviations`` (one per class) at ``epsilon``: what
    :meth:`SentenceVote.plan_batch` does, for callers that reuse deviations across epsilons."""
    return plan_selection(deviations, sampler_epsilon(epsilon, len(deviations)))


def vote_log_probs(deviations: npt.ArrayLike, epsilon: float) -> FloatArray:
    """The exact distribution of the vote: the exponential mechanism mixed with the floor."""
    dev = np.asarray(deviations, dtype=np.float64)
    r = dev.shape[0]
    scores = -sampler_epsilon(epsilon, r) * dev / 4.0
    top = scores.max()
    log_mechanism = scores - (top + math.log(math.fsum(np.exp(scores - top))))
    mixed: FloatArray = np.logaddexp(math.log(GAMMA / r), math.log1p(-GAMMA) + log_mechanism)
    return mixed
