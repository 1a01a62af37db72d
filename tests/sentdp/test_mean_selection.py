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
    epsilons = [1.0, 2.0, 3.0]
    together = mechanism.plan_batch(documents, epsilons)
    for doc, eps, plan in zip(documents, epsilons, together, strict=True):
        (alone,) = mechanism.plan_batch([doc], [eps])
        assert plan.thresholds == alone.thresholds
        assert plan.counts == alone.counts
        np.testing.assert_array_equal(plan.order, alone.order)


def test_log_probs_follow_the_utility_sign_and_scale() -> None:
    """Nearer candidates are likelier, and the log ratio of two candidates is
    -epsilon_plan (dev_f - dev_g) / 4 with dev = round(64 k ||f - mu|| / R): k counts."""
    radius = 2.0
    candidates = np.array([[0.1, 0.0], [1.5, 0.0], [-1.0, 1.0]])
    mechanism = MeanCandidate(candidates, radius)
    row = np.array([[0.3, 0.1]])
    for k in (1, 2, 8):
        document = np.repeat(row, k, axis=0)  # the same mean at every k
        log_probs = mechanism.log_probs(document, 1.0)
        distances = np.linalg.norm(candidates - row, axis=1)
        devs = np.rint(UNITS * k * distances / radius)
        expected = -mechanism.plan_epsilon(1.0) * (devs - devs[0]) / 4
        np.testing.assert_allclose(log_probs - log_probs[0], expected, atol=1e-5)
        assert np.argmax(log_probs) == np.argmin(distances)


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
    extreme = np.array([[1e300, 0.0], [0.0, 1e-320], [-3e-200, 4e-200]])
    np.testing.assert_allclose(clipped_mean(extreme, 2.0), [2.0 / 3, 0.0], atol=1e-15)


@pytest.mark.parametrize("radius", [2.0**-100, 1e-20, 1.0, 1e20, 2.0**100])
def test_extreme_rows_and_radii_stay_within_epsilon(radius: float) -> None:
    """Rows far outside the ball, rows near zero and radii at the ends of their range: the
    float arithmetic (in units of R) keeps every shift within epsilon."""
    rng = np.random.default_rng(3)
    candidates = rng.normal(size=(40, 2)) * radius * rng.uniform(1e-3, 3.0, size=(40, 1))
    mechanism = MeanCandidate(candidates, radius)
    k = 1000
    base = rng.normal(size=(k, 2)) * radius * 1e-3
    for first, second in (
        ([radius, 0.0], [-radius, 0.0]),
        ([1e300, 0.0], [0.0, -1e300]),
        ([1e-320, 0.0], [radius * 1e-30, radius]),
    ):
        d, d2 = base.copy(), base.copy()
        d[0], d2[0] = first, second
        for epsilon in (1.0, 10.0):
            s = shifts(mechanism, d, d2, epsilon)
            assert np.abs(s).max() <= epsilon
            assert s.max() - s.min() <= epsilon


def test_refusals_depend_on_public_values_only() -> None:
    """How many sentences a document may have follows from the candidates and R alone: a
    document one sentence too long is refused whatever its rows, one within is accepted
    whatever its rows (a refusal is an output too)."""
    far = MeanCandidate(np.array([[2.0**30, 0.0], [0.0, 0.0]]), 1.0)
    limit = far.longest()
    assert 1 <= limit < 64
    rng = np.random.default_rng(2)
    for rows in (rng.normal(size=(limit, 2)), np.full((limit, 2), 1e300), -np.ones((limit, 2))):
        far.deviations(rows)  # accepted
        with pytest.raises(InputError, match="at most"):
            far.deviations(np.vstack([rows, rows[:1]]))
    with pytest.raises(InputError, match="too far"):
        MeanCandidate(np.array([[2.0**40, 0.0]]), 1.0)


def test_refusals() -> None:
    with pytest.raises(InputError, match="radius"):
        MeanCandidate(np.ones((3, 2)), 0.0)
    with pytest.raises(InputError, match="radius"):
        MeanCandidate(np.ones((3, 2)), float("nan"))
    with pytest.raises(InputError, match="radius"):
        MeanCandidate(np.ones((3, 2)), 1e-200)
    with pytest.raises(InputError, match="radius"):
        clipped_mean(np.ones((1, 2)), -1.0)
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
