"""DeepCandidate: the exponential mechanism over public candidates, scored by Tukey depth.

A document x is k sentence embeddings (rows of a (k, d) array, already recoded by H o G).
Each candidate f of the public set F gets the utility ``u(x, f) = -max_j |h_j - k/2|`` with
``h_j = #{s in x : s . v_j >= f . v_j}`` over the first p fixed directions v_j: minus the
approximate Tukey depth's distance from the centre, the LOWEST depth over the directions (the
paper's text; its appendix pseudocode's max over directions is a slip). Replacing one
sentence moves every h_j by at most one, so the utility has sensitivity 1 and sampling f with
probability proportional to ``exp(epsilon * u / 2)`` is epsilon-SentDP.

Floating point: the sampler (:mod:`sentdp.sampling`) puts every candidate within
``2**-50`` of the exact distribution and mixes in a uniform floor of weight gamma = 2**-20,
so a candidate's probability can be off by a factor at most ``1 +- delta`` with
``delta = 2**-50 * m / gamma``. Running the exponential mechanism at ``epsilon - eta`` with
``eta = 2 ln((1 + delta) / (1 - delta))`` (about 1.9e-5 for m = 5,000) makes it
epsilon-SentDP and epsilon-bounded-range (the zCDP charge's premise) for exactly the epsilon
that is asked for and charged. See :func:`privacy_slack`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp.depth import DepthIndex, DeviationArray, TorchDepthIndex
from sentdp.errors import InputError
from sentdp.sampling import (
    GAMMA,
    SAMPLER_ABS_ERROR,
    RandomBytes,
    SelectionPlan,
    SystemRandomBytes,
    draw,
    draw_words,
    plan_selection,
)

FloatArray = npt.NDArray[np.float64]


def privacy_slack(m: int) -> float:
    """eta: how much epsilon the float error of sampling among m candidates may cost.

    Each sampled probability is within ``2**-50`` of the exact one and, with the floor, at
    least ``gamma / m``: within a factor ``1 +- delta``, ``delta = 2**-50 m / gamma``. So each
    outcome's log ratio between neighbours moves by at most ``ln((1 + delta) / (1 - delta))``
    (what epsilon-DP needs) and their range by twice that (what epsilon-bounded range, on
    which the zCDP charge ``epsilon**2 / 8`` relies, needs): eta is twice it, so that a
    mechanism run at ``epsilon - eta`` is both."""
    delta = SAMPLER_ABS_ERROR * m / GAMMA
    if not 0 < delta < 0.5:
        raise InputError(f"cannot run the mechanism over {m} candidates")
    return 2.0 * (math.log1p(delta) - math.log1p(-delta))


def mechanism_epsilon(epsilon: float, m: int) -> float:
    """The epsilon the exponential mechanism runs at so that the total guarantee is ``epsilon``."""
    return epsilon_less_slack(
        epsilon, privacy_slack(m), f"the sampler's float slack for {m} candidates"
    )


def epsilon_less_slack(epsilon: float, slack: float, what: str) -> float:
    """``epsilon - slack`` for a finite number ``epsilon`` above ``slack`` (``what`` the slack
    is, for the error message); anything else is an :class:`InputError`."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float | np.floating):
        raise InputError(f"epsilon must be a number, got {type(epsilon).__name__}")
    eps = float(epsilon)
    if not math.isfinite(eps) or eps <= slack:
        raise InputError(
            f"epsilon must be a finite number above {slack:.3g} ({what}), got {epsilon!r}"
        )
    return eps - slack


def _as_sentences(sentences: npt.ArrayLike, dim: int) -> FloatArray:
    array = np.asarray(sentences, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != dim:
        raise InputError(
            f"sentences must be a (k, {dim}) array of sentence embeddings, got shape {array.shape}"
        )
    if array.shape[0] == 0:
        raise InputError("a document needs at least one sentence")
    if not np.isfinite(array).all():
        raise InputError("sentence embeddings must be finite (no NaN or infinity)")
    return array


def _log_probs_from_deviations(deviations: npt.NDArray[np.integer], epsilon: float) -> FloatArray:
    utilities = -np.asarray(deviations, dtype=np.float64) / 2.0
    return selection_log_probs(utilities, epsilon)


def tukey_utility(
    sentences: npt.ArrayLike, candidates: npt.ArrayLike, directions: npt.ArrayLike
) -> FloatArray:
    """Utilities ``-max_j |h_j - k/2|`` of every candidate: shape (m,), values in [-k/2, 0].

    ``sentences`` (k, d), ``candidates`` (m, d), ``directions`` (p, d). Ties count as ``>=``.
    """
    index = DepthIndex(candidates, directions)
    document = _as_sentences(sentences, index.directions.shape[1])
    (deviations,) = index.deviations(document, [document.shape[0]], [index.p_max])
    return -deviations.astype(np.float64) / 2.0


def selection_log_probs(utilities: npt.ArrayLike, epsilon: float) -> FloatArray:
    """Natural-log probabilities of the distribution :meth:`DeepCandidate.sample` follows.

    The exponential mechanism ``exp(epsilon' * u / 2)`` at ``epsilon' = epsilon - eta``,
    normalised in log space and mixed with the uniform floor gamma.
    """
    u = np.asarray(utilities, dtype=np.float64)
    eps = mechanism_epsilon(epsilon, u.shape[0])
    return floored_log_probs(eps * u / 2.0)


def floored_log_probs(scores: FloatArray) -> FloatArray:
    """Log-probabilities of ``P(i) proportional to exp(scores_i)``, normalised in log space
    and mixed with the sampler's uniform floor gamma / m."""
    m = scores.shape[0]
    top = scores.max()
    log_mechanism = scores - (top + math.log(math.fsum(np.exp(scores - top))))
    mixed: FloatArray = np.logaddexp(math.log(GAMMA / m), math.log1p(-GAMMA) + log_mechanism)
    return mixed


def sample_from_utilities(
    utilities: npt.ArrayLike, epsilon: float, rng: RandomBytes | None = None
) -> int:
    """Sample like :meth:`DeepCandidate.sample` from utilities already computed.

    For evaluation and tuning, which reuse one document's utilities across many epsilons.
    """
    u = np.asarray(utilities, dtype=np.float64)
    deviations = np.rint(-2.0 * u).astype(np.int64)
    if u.ndim != 1 or deviations.min() < 0 or not np.array_equal(deviations, -2.0 * u):
        raise InputError("utilities must be a vector of non-positive half-integers")
    plan = plan_selection(deviations, mechanism_epsilon(epsilon, u.shape[0]))
    return int(DeepCandidate.draw_plans([plan], rng)[0])


class DeepCandidate:
    """The mechanism over a fixed public candidate set F and fixed public directions V.

    ``candidates`` (m, d) are public document embeddings; ``directions`` (p_max, d) are
    data-independent unit vectors, of which a document uses the first p. ``device`` picks the
    backend: None or "cpu" for NumPy, a CUDA device for torch.
    """

    def __init__(
        self, candidates: npt.ArrayLike, directions: npt.ArrayLike, *, device: Any = None
    ) -> None:
        self._index: DepthIndex | TorchDepthIndex
        if device is None or str(device) == "cpu":
            self._index = DepthIndex(candidates, directions)
        else:
            self._index = TorchDepthIndex(candidates, directions, device)
        self.m = self._index.m
        self.p_max = self._index.p_max
        self.dim = self._index.directions.shape[1]

    def _deviations(
        self, documents: Sequence[npt.ArrayLike], ps: Sequence[int] | None
    ) -> list[DeviationArray]:
        arrays = [_as_sentences(doc, self.dim) for doc in documents]
        if not arrays:
            return []
        chosen = [self.p_max] * len(arrays) if ps is None else [int(p) for p in ps]
        stacked = np.concatenate(arrays)
        return self._index.deviations(stacked, [a.shape[0] for a in arrays], chosen)

    def utilities(self, sentences: npt.ArrayLike, p: int | None = None) -> FloatArray:
        """(m,) utilities of every candidate for one document, using its first p directions."""
        return self.utilities_batch([sentences], None if p is None else [p])[0]

    def utilities_batch(
        self, documents: Sequence[npt.ArrayLike], ps: Sequence[int] | None = None
    ) -> list[FloatArray]:
        """Utilities for many documents at once, each with its own k and p."""
        return [-d.astype(np.float64) / 2.0 for d in self._deviations(documents, ps)]

    def log_probs(
        self, sentences: npt.ArrayLike, epsilon: float, p: int | None = None
    ) -> FloatArray:
        """(m,) log-probabilities with which :meth:`sample` picks each candidate."""
        (deviations,) = self._deviations([sentences], None if p is None else [p])
        return _log_probs_from_deviations(deviations, epsilon)

    def sample(
        self,
        sentences: npt.ArrayLike,
        epsilon: float,
        p: int | None = None,
        rng: RandomBytes | None = None,
    ) -> int:
        """Privately pick one candidate index for one document (epsilon-SentDP)."""
        return int(self.sample_batch([sentences], [epsilon], None if p is None else [p], rng)[0])

    def plan_batch(
        self,
        documents: Sequence[npt.ArrayLike],
        epsilons: Sequence[float],
        ps: Sequence[int] | None = None,
    ) -> list[SelectionPlan]:
        """Validate a batch and compute every document's selection plan; draws no randomness.

        Each document has its own k, epsilon and p. An error here means the mechanism has
        not run for any document of the batch.
        """
        if len(epsilons) != len(documents):
            raise InputError(f"got {len(documents)} documents but {len(epsilons)} epsilons")
        run_at = [mechanism_epsilon(eps, self.m) for eps in epsilons]
        deviations = self._deviations(documents, ps)
        return [plan_selection(d, eps) for d, eps in zip(deviations, run_at, strict=True)]

    @staticmethod
    def draw_plans(
        plans: Sequence[SelectionPlan], rng: RandomBytes | None = None
    ) -> npt.NDArray[np.int64]:
        """Draw one candidate per plan: exactly 32 random bytes each, from the CSPRNG by default."""
        words = draw_words(rng if rng is not None else SystemRandomBytes(), len(plans))
        return np.array([draw(plan, w) for plan, w in zip(plans, words, strict=True)], np.int64)

    def sample_batch(
        self,
        documents: Sequence[npt.ArrayLike],
        epsilons: Sequence[float],
        ps: Sequence[int] | None = None,
        rng: RandomBytes | None = None,
    ) -> npt.NDArray[np.int64]:
        """Pick one candidate per document; each document has its own k, epsilon and p.

        Every argument is validated before any randomness is drawn. ``rng`` defaults to the
        operating system's CSPRNG; pass a seeded ``numpy.random.Generator`` only in tests.
        """
        return self.draw_plans(self.plan_batch(documents, epsilons, ps), rng)
