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
rounding, being monotone, keeps integer deviations within that too. The plan runs at
``epsilon' / (UNITS + 1)`` in DeepCandidate's deviation units (a deviation change of 2 costs
epsilon' there), so a deviation may move by up to ``2 UNITS + 2``: two units of slack for
float error. Everything is computed in units of R (candidates divided by R, each row as its
direction times its clipped length, norms taken of rows divided by their largest entry), so
no square underflows or overflows; the mean is summed pairwise. With at most
:data:`MAX_SENTENCES` rows in the unit ball and deviations below :data:`MAX_DEVIATION`, the
float error of a deviation stays below 1e-3 units. The mechanism is epsilon'-SentDP with
``epsilon' = epsilon - eta`` covering the sampler's float error exactly as for DeepCandidate
(:func:`sentdp.mechanism.privacy_slack`).

Refusals are outputs too: every refusal depends on public values only (k, R, the
candidates, epsilon), never on a sentence's embedding, beyond its being finite and of the
right size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sentdp.errors import InputError, InternalError
from sentdp.mechanism import (
    DeepCandidate,
    _as_sentences,
    floored_log_probs,
    mechanism_epsilon,
)
from sentdp.sampling import RandomBytes, SelectionPlan, plan_selection

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

UNITS = 64
"""Deviation units per unit of utility: distances are rounded to 1/64 of a utility unit."""
MAX_DEVIATION = 2**40
"""Deviations stay far inside int64 and the sampler's level arithmetic."""
MAX_SENTENCES = 2**20
"""The longest document: bounds the float error of the mean (see the module docstring)."""
RADII = (2.0**-100, 2.0**100)
"""The clipping radius's range: far from where its reciprocal could underflow or overflow."""


def clipped_mean(sentences: npt.ArrayLike, radius: float) -> FloatArray:
    """The mean of the rows of ``sentences``, each first scaled to norm at most ``radius``."""
    r = _radius(radius)
    rows = np.asarray(sentences, dtype=np.float64)
    rows = _as_sentences(rows, rows.shape[-1] if rows.ndim else 0)
    mean: FloatArray = _unit_clipped_mean(rows, r) * r
    return mean


def _unit_clipped_mean(rows: FloatArray, radius: float) -> FloatArray:
    """The mean, in units of ``radius``, of the rows clipped to norm ``radius``: each row is
    its direction (from the row divided by its largest entry, so no square underflows or
    overflows) times ``min(norm / radius, 1)``, and the rows are summed pairwise (NumPy sums
    pairwise along the contiguous axis)."""
    largest = np.abs(rows).max(axis=1, keepdims=True)
    unit = rows / np.where(largest > 0, largest, 1.0)  # entries in [-1, 1]
    norms = np.linalg.norm(unit, axis=1, keepdims=True)  # in [1, sqrt(d)], or 0 for a zero row
    with np.errstate(over="ignore", under="ignore"):
        length = np.minimum(largest * norms / radius, 1.0)
    direction = unit / np.where(norms > 0, norms, 1.0)
    clipped = np.ascontiguousarray((direction * length).T)
    mean: FloatArray = clipped.sum(axis=1) / rows.shape[0]
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
        self.radius = _radius(radius)
        self.candidates = c
        self._scaled = c / self.radius
        self._reach = float(np.linalg.norm(self._scaled, axis=1).max()) + 1.0
        self.m, self.dim = c.shape
        if not (np.isfinite(self._scaled).all() and math.isfinite(self._reach)) or (
            self.longest() < 1
        ):
            raise InputError("the candidates are too far from the origin for this radius")

    def longest(self) -> int:
        """The most sentences a document may have (public: from the candidates and R)."""
        return int(min(MAX_SENTENCES, (MAX_DEVIATION - 1) // (UNITS * self._reach)))

    def deviations(self, sentences: npt.ArrayLike) -> IntArray:
        """(m,) integer deviations ``round(UNITS k ||f - mu|| / R)`` less their minimum."""
        rows = _as_sentences(sentences, self.dim)
        k = rows.shape[0]
        if k > self.longest():  # public: k, the candidates and R decide, not the rows
            raise InputError(
                f"a document may have at most {self.longest()} sentences for this mechanism"
            )
        mu = _unit_clipped_mean(rows, self.radius)
        distances = np.linalg.norm(self._scaled - mu, axis=1)
        scaled = UNITS * k * distances
        if not (np.isfinite(scaled).all() and scaled.max() < MAX_DEVIATION):  # cannot happen
            raise InternalError("a mean-distance deviation left its public bound")
        rounded = np.rint(scaled).astype(np.int64)
        shifted: IntArray = rounded - rounded.min()
        return shifted

    def plan_epsilon(self, epsilon: float) -> float:
        """The epsilon the sampler's plan runs at, in DeepCandidate's deviation units."""
        return mechanism_epsilon(epsilon, self.m) / (UNITS + 1)

    def log_probs(self, sentences: npt.ArrayLike, epsilon: float) -> FloatArray:
        """(m,) natural-log probabilities with which :meth:`sample_batch` picks each candidate."""
        return self.log_probs_for(self.deviations(sentences), epsilon)

    def log_probs_for(self, deviations: IntArray, epsilon: float) -> FloatArray:
        """:meth:`log_probs` from known :meth:`deviations` (callers that reuse them across
        epsilons)."""
        utilities = -np.asarray(deviations, dtype=np.float64) / 2.0
        return floored_log_probs(self.plan_epsilon(epsilon) * utilities / 2.0)

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


def _radius(radius: float) -> float:
    if isinstance(radius, bool) or not isinstance(radius, int | float | np.floating):
        raise InputError(f"the clipping radius must be a number, got {type(radius).__name__}")
    r = float(radius)
    if not (math.isfinite(r) and RADII[0] <= r <= RADII[1]):
        raise InputError(f"the clipping radius must lie in [2**-100, 2**100], got {radius!r}")
    return r
