"""MeanCandidate: the exponential mechanism over public candidates, scored by distance to the
document's clipped mean.

A document x is k sentence embeddings (rows of a (k, d) array, already recoded by H o G).
Each row is clipped to norm at most R (a public radius), and ``mu`` is their mean. Candidate
f gets the utility ``u(x, f) = -k ||f - mu|| / (2 R)``. Neighbouring documents have the same
k (README, "Unit of privacy") and differ in one row; clipped rows lie in the ball of radius R,
so replacing one moves ``mu`` by at most ``2 R / k`` and every utility by at most 1: sampling
f with probability proportional to ``exp(epsilon * u / 2)`` is epsilon-SentDP, and like every
exponential mechanism epsilon-bounded-range (the zCDP charge's premise).

Where DeepCandidate's Tukey depth takes at most k / 2 + 1 values (few for short documents,
so the deepest level holds many candidates, and a long one counts sentences, not distances),
this utility separates candidates by how far they are from the document's centre.

Exactness: the floor-safe sampler of :mod:`sentdp.sampling` draws over integer deviations,
so distances are rounded to ``1 / UNITS`` of the utility's scale: ``dev(f) = round(UNITS * k
||f - mu|| / R)`` (then shifted by its minimum, which leaves the distribution unchanged).
Replacing a row moves the real ``UNITS * k ||f - mu|| / R`` by at most ``2 UNITS``, and
rounding (plus float error far below one unit) by at most 1 more, so a deviation moves by at
most ``2 UNITS + 1 < 2 (UNITS + 1)``. The plan runs at ``epsilon' / (UNITS + 1)`` in
DeepCandidate's deviation units (a deviation change of 2 costs epsilon' there), so the
mechanism is epsilon'-SentDP, with ``epsilon' = epsilon - eta`` covering the sampler's float
error exactly as for DeepCandidate (:func:`sentdp.mechanism.privacy_slack`). The rounding
costs a factor ``UNITS / (UNITS + 1)`` of epsilon in sharpness, not in privacy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sentdp.errors import InputError
from sentdp.mechanism import (
    DeepCandidate,
    floored_log_probs,
    mechanism_epsilon,
)
from sentdp.sampling import RandomBytes, SelectionPlan, plan_selection

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

UNITS = 64
"""Deviation units per unit of utility: distances are rounded to 1/64 of a utility unit."""
MAX_DEVIATION = 2**40
"""Deviations stay far inside int64 and the sampler's level arithmetic (k up to millions)."""


def clipped_mean(sentences: npt.ArrayLike, radius: float) -> FloatArray:
    """The mean of the rows of ``sentences``, each first scaled to norm at most ``radius``."""
    rows = _rows(sentences)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    scale = np.minimum(1.0, radius / np.maximum(norms, np.finfo(np.float64).tiny))
    mean: FloatArray = (rows * scale).mean(axis=0)
    return mean


class MeanCandidate:
    """The mechanism over a fixed public candidate set F with a public clipping radius R.

    ``candidates`` (m, d) are public document embeddings in the recoded space; ``radius`` is
    R (public: chosen from public data, never from a user's document).
    """

    def __init__(self, candidates: npt.ArrayLike, radius: float) -> None:
        c = np.asarray(candidates, dtype=np.float64)
        if c.ndim != 2 or c.shape[0] == 0 or c.shape[1] == 0:
            raise InputError(f"candidates must be a non-empty (m, d) array, got {c.shape}")
        if not np.isfinite(c).all():
            raise InputError("candidates must be finite")
        if isinstance(radius, bool) or not (math.isfinite(radius) and radius > 0):
            raise InputError(f"the clipping radius must be a finite number > 0, got {radius!r}")
        self.candidates = c
        self.radius = float(radius)
        self.m, self.dim = c.shape

    def deviations(self, sentences: npt.ArrayLike) -> IntArray:
        """(m,) integer deviations ``round(UNITS k ||f - mu|| / R)`` less their minimum."""
        rows = _rows(sentences, self.dim)
        mu = clipped_mean(rows, self.radius)
        distances = np.linalg.norm(self.candidates - mu, axis=1)
        scaled = UNITS * rows.shape[0] * distances / self.radius
        if not (np.isfinite(scaled).all() and scaled.max() < MAX_DEVIATION):
            raise InputError("the document is too long for the mean-distance mechanism")
        rounded = np.rint(scaled).astype(np.int64)
        shifted: IntArray = rounded - rounded.min()
        return shifted

    def plan_epsilon(self, epsilon: float) -> float:
        """The epsilon the sampler's plan runs at, in DeepCandidate's deviation units."""
        return mechanism_epsilon(epsilon, self.m) / (UNITS + 1)

    def log_probs(self, sentences: npt.ArrayLike, epsilon: float) -> FloatArray:
        """(m,) natural-log probabilities with which :meth:`sample_batch` picks each candidate."""
        deviations = self.deviations(sentences).astype(np.float64)
        return floored_log_probs(self.plan_epsilon(epsilon) * (-deviations / 2.0) / 2.0)

    def plan_batch(
        self, documents: Sequence[npt.ArrayLike], epsilons: Sequence[float]
    ) -> list[SelectionPlan]:
        """Validate a batch and compute every document's selection plan; draws no randomness."""
        if len(epsilons) != len(documents):
            raise InputError(f"got {len(documents)} documents but {len(epsilons)} epsilons")
        run_at = [self.plan_epsilon(eps) for eps in epsilons]
        deviations = [self.deviations(doc) for doc in documents]
        return [plan_selection(d, eps) for d, eps in zip(deviations, run_at, strict=True)]

    def sample_batch(
        self,
        documents: Sequence[npt.ArrayLike],
        epsilons: Sequence[float],
        rng: RandomBytes | None = None,
    ) -> IntArray:
        """One candidate index per document (epsilon-SentDP each), from the CSPRNG by default."""
        return DeepCandidate.draw_plans(self.plan_batch(documents, epsilons), rng)


def _rows(sentences: npt.ArrayLike, dim: int | None = None) -> FloatArray:
    array = np.asarray(sentences, dtype=np.float64)
    if array.ndim != 2 or (dim is not None and array.shape[1] != dim):
        wanted = f"(k, {dim})" if dim is not None else "(k, d)"
        raise InputError(f"sentences must be a {wanted} array, got shape {array.shape}")
    if array.shape[0] == 0:
        raise InputError("a document needs at least one sentence")
    if not np.isfinite(array).all():
        raise InputError("sentence embeddings must be finite (no NaN or infinity)")
    return array
