"""The audit's statistics: valid lower bounds from samples, and power against broken ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.audit_stats import (
    clopper_pearson,
    event_bound,
    fit_pvalue,
    lower_bound,
    range_bound,
    ratio_bound,
)


def exponential_samples(epsilon: float, shift: int, n: int, seed: int) -> np.ndarray:
    """Samples of an exponential mechanism over 20 outcomes whose utility moves by ``shift``."""
    utilities = -np.abs(np.arange(20) - 10 + shift).astype(float)
    weights = np.exp(epsilon * utilities / 2)
    return np.random.default_rng(seed).choice(20, size=n, p=weights / weights.sum())


def exact_loss(epsilon: float) -> float:
    def probs(shift: int) -> np.ndarray:
        w = np.exp(epsilon * -np.abs(np.arange(20) - 10 + shift) / 2)
        return w / w.sum()

    return float(np.max(np.abs(np.log(probs(0)) - np.log(probs(1)))))


def test_clopper_pearson_brackets_the_estimate() -> None:
    lower, upper = clopper_pearson(30, 100, 0.025)
    assert 0.2 < lower < 0.3 < upper < 0.41
    assert clopper_pearson(0, 50, 0.05)[0] == 0.0
    assert clopper_pearson(50, 50, 0.05)[1] == 1.0


def test_an_honest_mechanism_is_never_flagged_and_the_bound_is_informative() -> None:
    bounds = []
    for seed in range(20):
        d = exponential_samples(1.0, 0, 4000, seed)
        d2 = exponential_samples(1.0, 1, 4000, 1000 + seed)
        bounds.append(lower_bound(d.tolist(), d2.tolist()).epsilon_lower)
    assert max(bounds) <= exact_loss(1.0) <= 1.0  # at 95% each; none of 20 over
    assert np.median(bounds) > 0.5 * exact_loss(1.0)  # and not vacuous


def test_a_mechanism_running_at_four_times_its_epsilon_is_flagged() -> None:
    assert exact_loss(4.0) > 1.5
    d = exponential_samples(4.0, 0, 4000, 1)
    d2 = exponential_samples(4.0, 1, 4000, 2)
    bound = lower_bound(d.tolist(), d2.tolist())
    assert bound.epsilon_lower > 1.0  # declared 1: flagged
    assert bound.direction in {"D over D'", "D' over D"}
    assert math.isfinite(bound.epsilon_lower)


def test_an_event_that_d2_raises_is_tested_as_d2_over_d() -> None:
    """The second public event (outcomes D' makes likelier) bounds ln P_D'(S) - ln P_D(S);
    tested the other way round it could never show a loss."""
    rng = np.random.default_rng(3)
    p = np.full(20, 1 / 20)  # D: uniform
    p2 = np.full(20, 0.5 / 19)
    p2[0] = 0.5  # D': ten times D's probability of outcome 0 (loss ln 10 = 2.3 that way)
    d = rng.choice(20, size=2000, p=p).tolist()
    d2 = rng.choice(20, size=2000, p=p2).tolist()
    assert event_bound(d, d2, {0}, 0.99, reverse=True).epsilon_lower > 1.8
    assert event_bound(d, d2, {0}, 0.99).epsilon_lower == 0.0
    with_events = lower_bound(d, d2, 0.95, raised=[set(range(1, 20))], lowered=[{0}])
    assert with_events.direction == "public event, D' over D"
    assert with_events.epsilon_lower > lower_bound(d, d2, 0.95).epsilon_lower > 0
    assert with_events.epsilon_lower <= math.log(10)


def test_the_fit_test_accepts_the_exact_distribution_and_rejects_a_near_one() -> None:
    rng = np.random.default_rng(5)
    probabilities = rng.dirichlet(np.full(3000, 0.3))  # thousands of rarely drawn outcomes
    honest = [
        fit_pvalue(rng.choice(3000, size=4000, p=probabilities).tolist(), probabilities)
        for _ in range(20)
    ]
    assert min(honest) > 1e-3  # 20 honest samples: none rejected at the audit's level
    tilted = probabilities**1.5  # sharper, as the same mechanism at a higher epsilon
    tilted /= tilted.sum()
    wrong = fit_pvalue(rng.choice(3000, size=4000, p=tilted).tolist(), probabilities)
    assert wrong < 1e-4
    assert fit_pvalue([0, 0, 0], [1.0, 0.0, 0.0]) == 1.0  # one cell: nothing to test
    assert fit_pvalue([0, 0, 1], [1.0, 0.0, 0.0]) == 0.0  # an impossible outcome was drawn


@pytest.mark.parametrize(
    "probabilities",
    [
        [0.9, 0.08, 0.015, 0.004, 0.001],
        [0.5, 0.3, 0.199, 0.001],
        [0.995, 0.003, 0.001, 0.001],
        [0.999, 0.0009, 0.0001],
    ],
)
def test_the_fit_test_accepts_honest_draws_from_a_few_skewed_outcomes(
    probabilities: list[float],
) -> None:
    """Labels: a handful of outcomes, most of them rare (the tail is folded into a cell)."""
    rng = np.random.default_rng(6)
    values = [
        fit_pvalue(rng.choice(len(probabilities), 2000, p=probabilities).tolist(), probabilities)
        for _ in range(50)
    ]
    assert min(values) > 1e-4  # the audit's misfit level: none of 50 honest runs
    assert np.mean(np.array(values) < 0.05) < 0.2  # about 5% expected below 0.05


def test_the_range_bound_adds_both_directions_each_at_half_the_error() -> None:
    d = [0] * 500 + [1] * 300 + [2] * 200
    d2 = [0] * 300 + [1] * 300 + [2] * 400
    expected = ratio_bound(500, 300, 1000, 1000, 0.05 / 2) + ratio_bound(
        400, 200, 1000, 1000, 0.05 / 2
    )
    assert range_bound(d, d2, {0}, {2}, 0.95) == pytest.approx(expected)
    assert expected > ratio_bound(500, 300, 1000, 1000, 0.05)  # more than either end alone
    assert range_bound(d, d2, {2}, {0}, 0.95) == 0.0  # events the wrong way round prove nothing


def test_the_range_bound_holds_at_its_confidence() -> None:
    """Two outcomes, P = (0.6, 0.4) and Q = (0.4, 0.6): range 2 ln 1.5. The bound exceeds
    it in at most 1 - confidence of repeated audits (Clopper-Pearson: far fewer)."""
    rng = np.random.default_rng(7)
    true_range = 2 * math.log(1.5)
    bounds = []
    for _ in range(400):
        d = (rng.random(2000) >= 0.6).astype(int)  # outcome 0 with probability 0.6
        d2 = (rng.random(2000) >= 0.4).astype(int)
        bounds.append(range_bound(d.tolist(), d2.tolist(), {0}, {1}, 0.9))
    assert np.mean(np.array(bounds) > true_range) <= 0.1
    assert np.median(bounds) > 0.5 * true_range  # and it has power
