"""The sampler follows log_probs: exact CDFs (mpmath), goodness of fit, fixed randomness."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy.stats import chisquare

from sentdp.mechanism import DeepCandidate, mechanism_epsilon, selection_log_probs
from sentdp.sampling import (
    BYTES_PER_DRAW,
    GAMMA,
    SAMPLER_ABS_ERROR,
    SelectionPlan,
    draw,
    draw_many,
    draw_words,
    plan_selection,
)

TWO64 = 1 << 64
TWO128 = 1 << 128


def exact_sampler_probabilities(plan: SelectionPlan) -> list[Fraction]:
    """The exact probability with which draw() returns each candidate, from its arithmetic."""

    def share(index: int, n: int) -> Fraction:  # P(floor(R * n / 2**128) == index)
        first = -((-index * TWO128) // n)
        last = -((-(index + 1) * TWO128) // n)
        return Fraction(last - first, TWO128)

    gamma = Fraction(1, 1 << 20)
    probs = [gamma * share(i, plan.m) for i in range(plan.m)]
    bounds = [0, *plan.thresholds, TWO64]
    for level in range(plan.reachable_levels):
        p_level = (1 - gamma) * Fraction(bounds[level + 1] - bounds[level], TWO64)
        for j in range(plan.counts[level]):
            candidate = int(plan.order[plan.starts[level] + j])
            probs[candidate] += p_level * share(j, plan.counts[level])
    return probs


def mpmath_level_cdf(counts: list[int], deviations: list[int], epsilon: float) -> list:
    """Cumulative probability of the levels under the exact exponential mechanism."""
    with mpmath.workdps(120):
        weights = [
            n * mpmath.exp(-mpmath.mpf(epsilon) * (d - deviations[0]) / 4)
            for n, d in zip(counts, deviations, strict=True)
        ]
        total = mpmath.fsum(weights)
        cdf, running = [], mpmath.mpf(0)
        for w in weights:
            running += w
            cdf.append(running / total)
        return cdf


def spread_deviations(k: int, rng: np.random.Generator, m: int) -> np.ndarray:
    """Deviations |2h - k| on every level of a k-sentence document, in random order."""
    levels = np.arange(k % 2, k + 1, 2)
    devs = np.concatenate([levels, rng.choice(levels, size=m - len(levels))])
    return rng.permutation(devs)


@pytest.mark.parametrize(("k", "epsilon"), [(2000, 1.4), (2000, 1000.0), (31, 0.1), (600, 5.0)])
def test_level_cdf_matches_mpmath_within_2_pow_minus_50(k: int, epsilon: float) -> None:
    rng = np.random.default_rng(k)
    devs = spread_deviations(k, rng, m=5000)
    run_at = mechanism_epsilon(epsilon, 5000)
    plan = plan_selection(devs, run_at)
    cdf = mpmath_level_cdf(list(plan.counts), list(plan.deviations), run_at)
    if k == 2000 and epsilon == 1.4:  # level probabilities span more than 300 orders
        assert cdf[0] > 1e-3
        assert cdf[-1] - cdf[-2] < 1e-300
    for level, threshold in enumerate(plan.thresholds):
        assert abs(mpmath.mpf(threshold) / TWO64 - cdf[level]) <= SAMPLER_ABS_ERROR
    # Levels dropped as unreachable carry less than 2**-64 of probability in total.
    assert 1 - cdf[len(plan.thresholds)] <= mpmath.mpf(2) ** -64 + SAMPLER_ABS_ERROR


@pytest.mark.parametrize(("k", "epsilon"), [(2000, 1.4), (30, 1.0), (9, 1000.0)])
def test_every_candidate_within_2_pow_minus_50_of_log_probs_and_above_the_floor(
    k: int, epsilon: float
) -> None:
    rng = np.random.default_rng(k + 1)
    m = max(300, k // 2 + 100)
    devs = spread_deviations(k, rng, m)
    plan = plan_selection(devs, mechanism_epsilon(epsilon, m))
    exact = exact_sampler_probabilities(plan)
    assert sum(exact) == 1
    floor = Fraction(GAMMA) * Fraction(TWO128 // m, TWO128)
    assert min(exact) >= floor
    assert float(floor) >= GAMMA / m * (1 - 1e-30)
    log_probs = selection_log_probs(-devs / 2.0, epsilon)
    for candidate, p in enumerate(exact):
        assert abs(float(p) - float(np.exp(log_probs[candidate]))) <= SAMPLER_ABS_ERROR


def test_injected_words_hit_the_level_boundaries_exactly() -> None:
    devs = np.array([4, 0, 2, 2, 4, 4, 0, 2])
    plan = plan_selection(devs, 1.0)
    assert plan.deviations == (0, 2, 4)
    no_floor = 1 << 44
    for level, threshold in enumerate(plan.thresholds):
        before = np.array([no_floor, threshold - 1, 0, 0], dtype=np.uint64)
        after = np.array([no_floor, threshold, 0, 0], dtype=np.uint64)
        assert devs[draw(plan, before)] == plan.deviations[level]
        assert devs[draw(plan, after)] == plan.deviations[level + 1]
    top = np.array([no_floor, TWO64 - 1, TWO64 - 1, TWO64 - 1], dtype=np.uint64)
    assert devs[draw(plan, top)] == plan.deviations[plan.reachable_levels - 1]
    # The floor: w0 < 2**44 picks floor(R * m / 2**128) whatever the utilities.
    floor_words = np.array([(1 << 44) - 1, 0, 0, 0], dtype=np.uint64)
    assert draw(plan, floor_words) == 0
    floor_words[2:] = TWO64 - 1
    assert draw(plan, floor_words) == len(devs) - 1


def test_vectorised_draws_equal_scalar_draws_word_for_word() -> None:
    rng = np.random.default_rng(21)
    devs = spread_deviations(41, rng, 997)
    plan = plan_selection(devs, 2.0)
    words = draw_words(rng, 20_000)
    edges = np.array(
        [
            [0, 0, 0, 0],
            [TWO64 - 1] * 4,
            [(1 << 44) - 1, 5, TWO64 - 1, 0],
            [1 << 44, 0, 1, TWO64 - 1],
        ],
        dtype=np.uint64,
    )
    words = np.concatenate([words, edges])
    np.testing.assert_array_equal(draw_many(plan, words), [draw(plan, w) for w in words])


def goodness_of_fit(
    devs: np.ndarray, epsilon: float, draws: int, seed: int
) -> tuple[float, np.ndarray]:
    m = len(devs)
    expected = np.exp(selection_log_probs(-devs / 2.0, epsilon)) * draws
    assert expected.min() >= 5, "every cell must expect at least five draws"
    plan = plan_selection(devs, mechanism_epsilon(epsilon, m))
    chosen = draw_many(plan, draw_words(np.random.default_rng(seed), draws))
    observed = np.bincount(chosen, minlength=m)
    return chisquare(observed, expected * draws / expected.sum()).pvalue, observed


def test_draws_follow_log_probs_chi_square() -> None:
    rng = np.random.default_rng(31)
    devs = spread_deviations(12, rng, 40)
    pvalue, _ = goodness_of_fit(devs, epsilon=1.5, draws=200_000, seed=32)
    assert pvalue > 1e-3


def test_draws_follow_log_probs_with_one_candidate_alone_in_the_deepest_level() -> None:
    devs = np.array([1] + [3] * 10 + [5] * 20 + [7] * 9)
    pvalue, observed = goodness_of_fit(devs, epsilon=2.0, draws=200_000, seed=33)
    assert pvalue > 1e-3
    assert observed[0] == observed.max()  # the lone deepest candidate is the most frequent


def test_a_wrong_distribution_fails_the_same_goodness_of_fit() -> None:
    # Guard against a vacuous test: draws at twice the epsilon are rejected by the same check.
    rng = np.random.default_rng(31)
    devs = spread_deviations(12, rng, 40)
    plan = plan_selection(devs, mechanism_epsilon(3.0, 40))
    chosen = draw_many(plan, draw_words(np.random.default_rng(32), 200_000))
    expected = np.exp(selection_log_probs(-devs / 2.0, 1.5)) * 200_000
    assert chisquare(np.bincount(chosen, minlength=40), expected).pvalue < 1e-6


class CountingBytes:
    def __init__(self) -> None:
        self.generator = np.random.default_rng(0)
        self.taken = 0

    def bytes(self, length: int, /) -> bytes:
        self.taken += length
        return self.generator.bytes(length)


def test_each_document_consumes_exactly_32_random_bytes() -> None:
    rng = np.random.default_rng(41)
    mechanism = DeepCandidate(rng.standard_normal((100, 5)), rng.standard_normal((6, 5)))
    source = CountingBytes()
    documents = [rng.standard_normal((k, 5)) for k in (1, 3, 30, 2)]
    mechanism.sample_batch(documents, [0.5, 5.0, 50.0, 500.0], [6, 1, 3, 6], rng=source)
    assert source.taken == 4 * BYTES_PER_DRAW
    mechanism.sample(documents[2], 1000.0, rng=source)
    assert source.taken == 5 * BYTES_PER_DRAW


def test_batch_sampling_equals_one_document_at_a_time() -> None:
    rng = np.random.default_rng(42)
    mechanism = DeepCandidate(rng.standard_normal((300, 6)), rng.standard_normal((10, 6)))
    documents = [rng.standard_normal((k, 6)) for k in (4, 12, 1, 7)]
    epsilons, ps = [1.0, 10.0, 0.3, 100.0], [10, 3, 1, 8]
    batch = mechanism.sample_batch(documents, epsilons, ps, rng=np.random.default_rng(7))
    one_by_one_rng = np.random.default_rng(7)
    singles = [
        mechanism.sample(doc, eps, p, rng=one_by_one_rng)
        for doc, eps, p in zip(documents, epsilons, ps, strict=True)
    ]
    np.testing.assert_array_equal(batch, singles)


def test_large_k_and_epsilon_pick_the_deepest_candidate() -> None:
    rng = np.random.default_rng(43)
    candidates = rng.standard_normal((500, 4)) * 0.05
    directions = rng.standard_normal((20, 4))
    document = rng.standard_normal((2000, 4))
    mechanism = DeepCandidate(candidates, directions)
    utilities = mechanism.utilities(document)
    picks = [mechanism.sample(document, 1000.0, rng=rng) for _ in range(20)]
    assert all(utilities[c] == utilities.max() for c in picks)


def test_default_randomness_is_the_system_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_urandom(n: int) -> bytes:
        calls.append(n)
        return bytes(n)

    monkeypatch.setattr("sentdp.sampling.os.urandom", fake_urandom)
    mechanism = DeepCandidate(np.eye(3), np.eye(3))
    assert mechanism.sample(np.eye(3), 1.0) == 0  # all-zero words: the floor, R = 0
    assert calls == [BYTES_PER_DRAW]


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_level_weights_equal_exact_rationals_bit_for_bit(seed: int) -> None:
    """The planner's weights (Dekker's two-product, significand shifts) are exactly
    proportional to the integers of the one-level-at-a-time exact-rational computation, for
    rates from 2**-600 (the scalar fallback) to 2**600 and gaps up to 2**52, and its plans
    equal the plans made from those integers: every privacy figure proved for them holds."""
    from fractions import Fraction

    from sentdp.sampling import _proportional_integers, level_weights, plan_levels
    from tests.sentdp.reference import scalar_level_weights

    rng = np.random.default_rng(seed)
    for _ in range(60):
        levels = int(rng.integers(1, 400))
        top = int(2 ** rng.uniform(0, 52))
        deviations = sorted({0, *(int(d) for d in rng.integers(0, top + 1, size=levels))})
        counts = [int(c) for c in rng.integers(1, 2**31, size=len(deviations))]
        epsilon = [
            2 ** rng.uniform(-600, 600),  # extremes, the scalar fallback included
            rng.uniform(1e-4, 100) / 65,  # what the mechanisms run at
            4 * 2 ** rng.uniform(-4, 9.4) / max(1, deviations[-1]),  # the last weight > 0
        ][_ % 3]
        vectorised = _proportional_integers(level_weights(counts, deviations, epsilon))
        exact = scalar_level_weights(counts, deviations, epsilon)
        assert [w == 0 for w in vectorised] == [w == 0 for w in exact]
        ratios = {Fraction(e, v) for e, v in zip(exact, vectorised, strict=True) if v}
        assert len(ratios) == 1
        (ratio,) = ratios
        assert ratio.numerator & (ratio.numerator - 1) == 0  # a power of two
        assert ratio.denominator & (ratio.denominator - 1) == 0
        few = rng.integers(1, 4, size=len(deviations))  # the same levels, as a plan's input
        candidates = np.repeat(np.asarray(deviations, dtype=np.int64), few)
        planned = plan_selection(candidates, epsilon)
        reference = plan_levels(
            candidates,
            lambda c, d: scalar_level_weights(c, d, epsilon),  # noqa: B023
        )
        assert planned.thresholds == reference.thresholds
        assert (planned.starts, planned.counts) == (reference.starts, reference.counts)
        np.testing.assert_array_equal(planned.order, reference.order)
