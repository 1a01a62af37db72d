"""Permute-and-flip's exact level masses: equal to the mechanism enumerated by hand, within the
stated float error of the ideal one, never worse than the exponential mechanism."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from sentdp.errors import InternalError
from sentdp.permute_flip import FRACTION_BITS, flip_probabilities
from sentdp.sampling import SAMPLER_ABS_ERROR, exact_product


def enumerated(keep: list[Fraction]) -> list[Fraction]:
    """P&F by its definition: every visiting order, stop at c with probability keep[c]."""
    orders = list(itertools.permutations(range(len(keep))))
    out = [Fraction(0)] * len(keep)
    for order in orders:
        going = Fraction(1, len(orders))
        for c in order:
            out[c] += going * keep[c]
            going *= 1 - keep[c]
    return out


def gaps_of(rate: float, deviations: list[int]) -> list[tuple[float, float]]:
    return [exact_product(rate, d - deviations[0]) for d in deviations]


@pytest.mark.parametrize(
    ("counts", "deviations"),
    [([1, 1], [0, 1]), ([2, 1, 2], [0, 7, 300]), ([1, 1, 1, 1, 1, 1], [0, 1, 2, 3, 50, 9000])],
)
@pytest.mark.parametrize("rate", [1e-3, 0.05, 1.0])
def test_masses_equal_the_enumerated_mechanism_for_the_rounded_keep_probabilities(
    counts: list[int], deviations: list[int], rate: float
) -> None:
    weights, total = flip_probabilities(counts, gaps_of(rate, deviations))
    assert sum(weights) == total
    keep = []
    for n, (hi, lo) in zip(counts, gaps_of(rate, deviations), strict=True):
        a = round(math.ldexp(math.exp(-hi) * (1 - lo), FRACTION_BITS))
        a = max(1, min(1 << FRACTION_BITS, a))  # never 0: see _rounded_exp
        keep += [Fraction(a, 1 << FRACTION_BITS)] * n
    per_outcome = enumerated(keep)
    start = 0
    for level, n in enumerate(counts):
        assert Fraction(weights[level], total) == sum(per_outcome[start : start + n])
        assert len(set(per_outcome[start : start + n])) == 1  # a level's outcomes share it
        start += n


@pytest.mark.parametrize("rate", [1e-4, 0.02, 0.7, 30.0])
def test_masses_are_within_the_stated_error_of_the_ideal_mechanism(rate: float) -> None:
    rng = np.random.default_rng(int(rate * 1e4))
    deviations = sorted({0, *(int(d) for d in rng.integers(1, 2000, size=11))})
    counts = [int(c) for c in rng.integers(1, 3, size=len(deviations))]
    outcomes = sum(counts)
    weights, total = flip_probabilities(counts, gaps_of(rate, deviations))
    with mpmath.workdps(60):
        keep = [mpmath.exp(-mpmath.mpf(rate) * d) for d in deviations]

        def integrand(x: mpmath.mpf, level: int) -> mpmath.mpf:
            out = keep[level]
            for j, (a, n) in enumerate(zip(keep, counts, strict=True)):
                out *= (1 - a * x) ** (n - (j == level))
            return out

        for level, n in enumerate(counts):
            ideal = mpmath.quad(lambda x, lv=level: integrand(x, lv), [0, 1])
            got = mpmath.mpf(weights[level]) / n / total
            assert abs(got - ideal) <= outcomes * SAMPLER_ABS_ERROR


@pytest.mark.parametrize("rate", [0.002, 0.02, 0.2])
def test_the_expected_utility_is_never_below_the_exponential_mechanism_s(rate: float) -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        deviations = np.sort(rng.integers(0, 400, size=int(rng.integers(2, 14))))
        deviations -= deviations[0]
        levels, counts = np.unique(deviations, return_counts=True)
        lv, ct = [int(v) for v in levels], [int(c) for c in counts]
        weights, total = flip_probabilities(ct, gaps_of(rate, lv))
        flip = sum(Fraction(w, total) * v for w, v in zip(weights, lv, strict=True))
        em = np.array([c * math.exp(-rate * v) for c, v in zip(ct, lv, strict=True)])
        exponential = float(em @ np.array(lv) / em.sum())
        assert float(flip) <= exponential + 1e-12  # lower expected deviation from the leader


def test_many_outcomes_stay_exact_and_malformed_levels_are_refused() -> None:
    deviations = list(range(0, 400, 2))
    weights, total = flip_probabilities([1] * 200, gaps_of(0.01, deviations))
    assert sum(weights) == total
    assert all(a >= b for a, b in itertools.pairwise(weights))  # deeper is likelier
    with pytest.raises(InternalError):
        flip_probabilities([1, 1], [(0.5, 0.0), (1.0, 0.0)])  # no leader at gap 0
    with pytest.raises(InternalError):
        flip_probabilities([1, 0], [(0.0, 0.0), (1.0, 0.0)])
    with pytest.raises(InternalError):
        flip_probabilities([1025], [(0.0, 0.0)])
    with pytest.raises(InternalError):
        flip_probabilities([1, 1], [(0.0, 0.0), (math.nan, 0.0)])
