"""Privacy of DeepCandidate: exact probability ratios for neighbouring documents."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from sentdp.errors import InputError
from sentdp.mechanism import (
    DeepCandidate,
    mechanism_epsilon,
    privacy_slack,
    selection_log_probs,
)
from sentdp.sampling import GAMMA
from tests.sentdp.reference import brute_force_utility

EPSILONS = [0.1, 1.0, 10.0, 100.0, 1000.0]


def neighbours(document: np.ndarray, candidates: np.ndarray, rng: np.random.Generator):
    """Every position replaced by adversarial, far-away, duplicate and candidate sentences."""
    k, d = document.shape
    for position in range(k):
        replacements = [
            rng.standard_normal(d) * 1e6,  # far outside the data
            -document[position] * 100.0,
            document[(position + 1) % k],  # duplicate of another sentence
            candidates[rng.integers(0, len(candidates))],  # exactly a candidate: ties
            np.zeros(d),
            rng.standard_normal(d),
        ]
        for replacement in replacements:
            neighbour = document.copy()
            neighbour[position] = replacement
            yield neighbour


@pytest.fixture(scope="module")
def setting() -> tuple[DeepCandidate, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    candidates = rng.standard_normal((400, 8)) * 0.3
    directions = rng.standard_normal((16, 8))
    return DeepCandidate(candidates, directions), candidates, directions


def test_neighbouring_documents_change_log_probabilities_by_at_most_epsilon(setting) -> None:
    mechanism, candidates, _ = setting
    rng = np.random.default_rng(12)
    worst = dict.fromkeys(EPSILONS, 0.0)
    for k in (1, 2, 3, 8, 15):
        for _ in range(3):
            document = rng.standard_normal((k, 8)) * 0.5
            base = {eps: mechanism.log_probs(document, eps) for eps in EPSILONS}
            for neighbour in neighbours(document, candidates, rng):
                for eps in EPSILONS:
                    gap = np.max(np.abs(base[eps] - mechanism.log_probs(neighbour, eps)))
                    assert gap <= eps + 1e-9, (k, eps, gap)
                    worst[eps] = max(worst[eps], gap)
    # The bound is nearly attained: a mechanism that ignored the data would pass trivially.
    for eps in (0.1, 1.0, 10.0):
        assert worst[eps] > 0.5 * eps, worst


def test_log_probs_equal_an_independent_computation(setting) -> None:
    mechanism, candidates, directions = setting
    rng = np.random.default_rng(13)
    for k in (1, 4, 17):
        document = rng.standard_normal((k, 8)) * 0.5
        utilities = brute_force_utility(document, candidates, directions)
        m = len(candidates)
        for eps in EPSILONS:
            run_at = eps - privacy_slack(m)
            scores = run_at * utilities / 2
            em = np.exp(scores - logsumexp(scores))
            expected = np.log(GAMMA / m + (1 - GAMMA) * em)
            got = mechanism.log_probs(document, eps)
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
            assert math.isclose(logsumexp(got), 0.0, abs_tol=1e-12)


def test_neighbouring_log_ratios_span_at_most_epsilon(setting) -> None:
    """Epsilon-bounded range, on which a zCDP tenant's charge epsilon**2 / 8 rests: for
    every neighbour the log ratios of all candidates lie within an interval of width
    epsilon (not only within [-epsilon, epsilon])."""
    mechanism, candidates, _ = setting
    rng = np.random.default_rng(14)
    worst = dict.fromkeys(EPSILONS, 0.0)
    for k in (1, 2, 3, 8):
        for _ in range(3):
            document = rng.standard_normal((k, 8)) * 0.5
            base = {eps: mechanism.log_probs(document, eps) for eps in EPSILONS}
            for neighbour in neighbours(document, candidates, rng):
                for eps in EPSILONS:
                    ratios = base[eps] - mechanism.log_probs(neighbour, eps)
                    span = float(ratios.max() - ratios.min())
                    assert span <= eps + 1e-9, (k, eps, span)
                    worst[eps] = max(worst[eps], span)
    for eps in (0.1, 1.0, 10.0):
        assert worst[eps] > 0.5 * eps, worst


def test_privacy_slack_is_about_2e_5_at_5000_candidates() -> None:
    """Twice the float error's worst log-ratio move (9.3e-6): the range of the log ratios
    moves by twice as much as any one of them."""
    delta = 2.0**-50 * 5000 / GAMMA
    assert privacy_slack(5000) == 2 * (math.log1p(delta) - math.log1p(-delta))
    assert 1.8e-5 < privacy_slack(5000) < 1.9e-5
    assert privacy_slack(50) < privacy_slack(5000)
    assert mechanism_epsilon(1.0, 5000) == pytest.approx(1.0 - privacy_slack(5000), abs=0)


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.nan, math.inf, -math.inf, 1e-7])
def test_epsilon_must_be_finite_and_above_the_slack(epsilon: float) -> None:
    with pytest.raises(InputError, match="epsilon must be a finite number above"):
        selection_log_probs(np.zeros(5000), epsilon)


def test_epsilon_of_the_wrong_type_is_refused() -> None:
    mechanism = DeepCandidate(np.eye(3), np.eye(3))
    with pytest.raises(InputError, match="epsilon must be a number"):
        mechanism.sample(np.eye(3), "1.0")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="epsilon must be a number"):
        mechanism.sample(np.eye(3), True)
