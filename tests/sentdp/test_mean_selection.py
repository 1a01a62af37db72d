"""MeanCandidate: exact neighbour ratios (adversarial rows, clipping, rounding), bounded
range, the sampler's fit to the exact distribution, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from sentdp.errors import InputError
from sentdp.mean_selection import UNITS, MeanCandidate, clipped_mean
from sentdp.sampling import draw_many, draw_words

EPSILONS = (0.3, 1.0, 3.0, 10.0)


def shifts(mechanism: MeanCandidate, d: np.ndarray, d2: np.ndarray, epsilon: float) -> np.ndarray:
    return mechanism.log_probs(d, epsilon) - mechanism.log_probs(d2, epsilon)


def neighbours(rng: np.random.Generator, k: int, dim: int, radius: float) -> list[tuple]:
    """Documents and one replaced row: random rows, rows far outside the ball (clipped), the
    replaced row swung to the antipode of its clipped self, a zero row."""
    base = rng.normal(size=(k, dim)) * radius * rng.uniform(0.2, 3.0, size=(k, 1))
    pairs = []
    for j in range(k):
        for replacement in (
            rng.normal(size=dim) * radius,
            rng.normal(size=dim) * 1e6,
            -base[j] / np.linalg.norm(base[j]) * radius * 50,
            np.zeros(dim),
        ):
            other = base.copy()
            other[j] = replacement
            pairs.append((base, other))
    return pairs


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("k", [1, 2, 5, 40])
def test_every_outcome_and_the_range_stay_within_epsilon(epsilon: float, k: int) -> None:
    rng = np.random.default_rng(int(epsilon * 10) + k)
    radius = 0.7
    candidates = rng.normal(size=(60, 4)) * rng.uniform(0.1, 4.0, size=(60, 1))
    mechanism = MeanCandidate(candidates, radius)
    for d, d2 in neighbours(rng, k, 4, radius):
        s = shifts(mechanism, d, d2, epsilon)
        assert np.abs(s).max() <= epsilon
        assert s.max() - s.min() <= epsilon  # epsilon-bounded range: rho = epsilon**2 / 8


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_bound_is_reached_by_a_row_swung_across_the_ball(epsilon: float) -> None:
    """One sentence at +R e1 or -R e1, candidates far along +-e1: each outcome's utility
    moves by the whole sensitivity, in opposite directions, so the exact shifts come within
    the rounding's UNITS / (UNITS + 1) and the floor of epsilon. A mechanism 10% too sharp
    fails the test above."""
    radius = 1.0
    e1 = np.eye(3)[0]
    candidates = np.stack([5 * e1, -5 * e1, np.eye(3)[1], np.eye(3)[2]])
    mechanism = MeanCandidate(candidates, radius)
    s = shifts(mechanism, e1[None, :] * radius, -e1[None, :] * radius, epsilon)
    assert np.abs(s).max() >= 0.45 * epsilon * UNITS / (UNITS + 1)
    assert s.max() - s.min() >= 0.9 * epsilon


def test_the_plan_of_a_document_is_its_own_in_any_batch() -> None:
    rng = np.random.default_rng(5)
    mechanism = MeanCandidate(rng.normal(size=(30, 3)), 1.0)
    documents = [rng.normal(size=(k, 3)) for k in (1, 4, 9)]
    alone = [mechanism.deviations(d) for d in documents]
    together = mechanism.plan_batch(documents, [1.0, 2.0, 3.0])
    for doc, plan, own in zip(documents, together, alone, strict=True):
        np.testing.assert_array_equal(mechanism.deviations(doc), own)
        assert plan.m == 30


def test_draws_follow_the_exact_distribution() -> None:
    rng = np.random.default_rng(11)
    mechanism = MeanCandidate(rng.normal(size=(20, 3)), 1.0)
    document = rng.normal(size=(6, 3))
    epsilon, draws = 2.0, 200_000
    expected = np.exp(mechanism.log_probs(document, epsilon)) * draws
    assert expected.min() >= 5
    (plan,) = mechanism.plan_batch([document], [epsilon])
    observed = np.bincount(
        draw_many(plan, draw_words(np.random.default_rng(12), draws)), minlength=20
    )
    assert chisquare(observed, expected * draws / expected.sum()).pvalue > 1e-3
    sharper = np.exp(mechanism.log_probs(document, 2 * epsilon))
    assert chisquare(observed, sharper * draws / sharper.sum()).pvalue < 1e-6  # not vacuous
    # sample_batch draws through the same plan, 32 bytes per document
    chosen = mechanism.sample_batch([document] * 3, [epsilon] * 3, np.random.default_rng(12))
    np.testing.assert_array_equal(chosen, draw_many(plan, draw_words(np.random.default_rng(12), 3)))


def test_rows_are_clipped_to_the_radius() -> None:
    rows = np.array([[30.0, 40.0], [0.3, 0.4], [0.0, 0.0]])
    np.testing.assert_allclose(clipped_mean(rows, 1.0), [(0.6 + 0.3) / 3, (0.8 + 0.4) / 3])


def test_refusals() -> None:
    with pytest.raises(InputError, match="radius"):
        MeanCandidate(np.ones((3, 2)), 0.0)
    with pytest.raises(InputError, match="radius"):
        MeanCandidate(np.ones((3, 2)), float("nan"))
    with pytest.raises(InputError, match="finite"):
        MeanCandidate(np.array([[1.0, np.inf]]), 1.0)
    mechanism = MeanCandidate(np.ones((3, 2)), 1.0)
    with pytest.raises(InputError, match="at least one sentence"):
        mechanism.deviations(np.zeros((0, 2)))
    with pytest.raises(InputError, match=r"\(k, 2\)"):
        mechanism.deviations(np.zeros((2, 3)))
    with pytest.raises(InputError, match="finite"):
        mechanism.deviations(np.array([[np.nan, 0.0]]))
    with pytest.raises(InputError, match="epsilons"):
        mechanism.plan_batch([np.ones((1, 2))], [1.0, 2.0])
    with pytest.raises(InputError):
        mechanism.log_probs(np.ones((1, 2)), 0.0)
