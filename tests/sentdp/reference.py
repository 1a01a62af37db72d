"""Slow, obviously-correct reference implementations the fast code is checked against."""

from __future__ import annotations

import numpy as np

from sentdp.depth import project


def brute_force_utility(
    sentences: np.ndarray, candidates: np.ndarray, directions: np.ndarray, p: int | None = None
) -> np.ndarray:
    """All m*k*p comparisons of the definition u = -max_j |h_j - k/2|, ties counted as >=."""
    ps = project(sentences, directions)[:, :p]
    pf = project(candidates, directions)[:, :p]
    h = (ps[None, :, :] >= pf[:, None, :]).sum(axis=1)  # (m, p)
    return -np.abs(h - sentences.shape[0] / 2).max(axis=1)


def scalar_level_weights(counts: list[int], deviations: list[int], epsilon: float) -> list[int]:
    """The sampler's integer level weights one level at a time with Python's exact rationals
    (the code :func:`sentdp.sampling.level_weights` vectorised): ``count * exp(-hi) * (1 -
    lo)`` with ``hi + lo = epsilon / 4 * gap`` exactly, then times 2**1074 as an integer."""
    import math

    rate = epsilon / 4.0
    weights = []
    for count, dev in zip(counts, deviations, strict=True):
        num, den = rate.as_integer_ratio()
        exact = num * (dev - deviations[0])
        hi = exact / den
        hi_num, hi_den = hi.as_integer_ratio()
        lo = (exact * hi_den - hi_num * den) / (den * hi_den)
        weight = count * (math.exp(-hi) * (1.0 - lo))
        w_num, w_den = weight.as_integer_ratio()
        weights.append(w_num * ((1 << 1074) // w_den))
    return weights
