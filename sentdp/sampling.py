"""Exact, constant-randomness sampling for the exponential mechanism over depth levels.

A document's candidates fall into at most k/2 + 1 *levels* of equal utility. One draw uses
exactly :data:`BYTES_PER_DRAW` random bytes, read as four 64-bit words ``(w0, w1, r_hi, r_lo)``:

* ``w0 < 2**44`` (probability exactly gamma = 2**-20): return ``floor(R * m / 2**128)``, a
  uniform candidate, whatever the data. This floor gives every candidate probability >= gamma/m.
* otherwise the level is the inverse CDF of the 64-bit uniform ``w1`` against integer
  thresholds, and the candidate inside the level is ``floor(R * n_level / 2**128)``, with
  ``R = r_hi * 2**64 + r_lo``.

There are no rejection loops and no data-dependent amount of randomness.

Level weights ``n_L * exp(-eps * (dev_L - dev_min) / 4)`` are computed relative to the deepest
level (the log-space normalisation), with the exponent split into an exact double-double so
each weight carries at most ~2 ulp of relative error. Thresholds are then computed from the
weights' exact binary values with integer arithmetic, so the probability of every level is
within ``2**-51 + 2**-64`` of the exact exponential mechanism, and every candidate's within
:data:`SAMPLER_ABS_ERROR`.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from sentdp.errors import InternalError

GAMMA = 2.0**-20
"""Probability of the data-independent uniform draw (the floor)."""

SAMPLER_ABS_ERROR = 2.0**-50
"""Bound on |sampled probability - exact mechanism probability| for every candidate."""

WORDS_PER_DRAW = 4
BYTES_PER_DRAW = 8 * WORDS_PER_DRAW
_FLOOR_CUTOFF = 1 << (64 - 20)  # w0 below this happens with probability GAMMA exactly
_TWO64 = 1 << 64
_MAX_CANDIDATES = 1 << 32  # the vectorised 128-bit product assumes n < 2**32


class RandomBytes(Protocol):
    """A source of uniformly random bytes; ``numpy.random.Generator`` satisfies it."""

    def bytes(self, length: int, /) -> bytes: ...


class SystemRandomBytes:
    """The operating system's CSPRNG (``os.urandom``): the default for every draw."""

    def bytes(self, length: int, /) -> bytes:
        return os.urandom(length)


def draw_words(rng: RandomBytes, draws: int) -> npt.NDArray[np.uint64]:
    """Read ``draws`` x 4 big-endian 64-bit words from ``rng`` (exactly 32 bytes per draw)."""
    raw = rng.bytes(BYTES_PER_DRAW * draws)
    if len(raw) != BYTES_PER_DRAW * draws:
        raise InternalError(f"random source returned {len(raw)} bytes, wanted {32 * draws}")
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(draws, WORDS_PER_DRAW)


def exact_product(a: float, n: int) -> tuple[float, float]:
    """``a * n`` as an unevaluated sum hi + lo, exact for a finite float a and an int n."""
    num, den = a.as_integer_ratio()
    exact_num = num * n
    hi = exact_num / den  # int / int is correctly rounded
    hi_num, hi_den = hi.as_integer_ratio()
    lo = (exact_num * hi_den - hi_num * den) / (den * hi_den)
    return hi, lo


def exact_products(a: float, ns: npt.NDArray[np.int64]) -> tuple[list[float], list[float]]:
    """:func:`exact_product` of ``a`` with each of ``ns`` (integers in [0, 2**53)), the same
    floats, vectorised: ``hi`` is the correctly rounded product, and ``lo`` its rounding
    error, which Dekker's two-product computes exactly in binary64 unless a partial product
    leaves the normal range; for such ``a`` every product is computed by
    :func:`exact_product`."""
    values = np.asarray(ns, dtype=np.int64)
    if not (2.0**-500 <= a <= 2.0**500) or (
        values.size and not 0 <= values.min() <= values.max() < 2**53
    ):
        pairs = [exact_product(a, int(n)) for n in values.tolist()]
        return [h for h, _ in pairs], [low for _, low in pairs]
    b = values.astype(np.float64)
    hi = a * b

    def split(x: npt.NDArray[np.float64] | float) -> tuple[Any, Any]:
        c = 134217729.0 * x  # 2**27 + 1: Veltkamp's split into two 26-bit halves
        high = c - (c - x)
        return high, x - high

    a_hi, a_lo = split(a)
    b_hi, b_lo = split(b)
    lo = ((a_hi * b_hi - hi) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return hi.tolist(), lo.tolist()


def _proportional_integers(xs: list[float]) -> list[int]:
    """Integers exactly proportional to ``xs`` (finite, non-negative floats): each float's
    53-bit significand shifted by its exponent, less the smallest exponent of a non-zero
    entry, so the integers are as short as the spread of the floats allows (every float is
    an integer times 2**-1074, so this is ``x * 2**1074`` divided by one power of two)."""
    significands, exponents = np.frexp(np.asarray(xs, dtype=np.float64))
    whole = (significands * 2.0**53).astype(np.int64)  # exact: 53 bits
    nonzero = whole != 0
    if not nonzero.any():
        return [0] * len(xs)
    shifts = exponents.astype(np.int64) - exponents[nonzero].min()
    return [n << s if n else 0 for n, s in zip(whole.tolist(), shifts.tolist(), strict=True)]


@dataclass(frozen=True)
class SelectionPlan:
    """One document's levels and the integer inverse-CDF thresholds that select among them."""

    m: int
    order: npt.NDArray[np.int64]
    """Candidate indices grouped by level, deepest level first."""
    starts: tuple[int, ...]
    counts: tuple[int, ...]
    thresholds: tuple[int, ...]
    """``thresholds[i]``: smallest w1 that selects a level after i. Levels whose threshold would
    reach 2**64 (probability < 2**-64 left) are unreachable and dropped."""
    deviations: tuple[int, ...]
    """The deviation |2h - k| shared by each level's candidates."""

    @property
    def reachable_levels(self) -> int:
        return len(self.thresholds) + 1


def level_weights(counts: list[int], deviations: list[int], epsilon: float) -> list[float]:
    """Unnormalised level weights ``n_L * exp(-epsilon * (dev_L - dev_0) / 4)``, ~2 ulp each."""
    rate = epsilon / 4.0
    gaps = np.asarray(deviations, dtype=np.int64) - deviations[0]
    his, los = exact_products(rate, gaps)
    return [
        count * (math.exp(-hi) * (1.0 - lo)) for count, hi, lo in zip(counts, his, los, strict=True)
    ]


def plan_selection(deviations: npt.NDArray[np.integer], epsilon: float) -> SelectionPlan:
    """Group candidates by deviation and compute the thresholds of the exponential mechanism.

    ``deviations`` are ``max_j |2 h_j - k|`` per candidate (utility ``-dev / 2``); ``epsilon``
    is the privacy parameter the mechanism runs at (already reduced by the float slack).
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InternalError(f"plan_selection needs a finite epsilon > 0, got {epsilon!r}")

    def weights(counts: list[int], level_devs: list[int]) -> list[int]:
        return _proportional_integers(level_weights(counts, level_devs, epsilon))

    return plan_levels(deviations, weights)


LevelWeights = Callable[[list[int], list[int]], list[int]]
"""``(counts, deviations) -> weights``: one non-negative integer per level (deepest first),
proportional to the probability that the level is drawn."""


def plan_levels(deviations: npt.NDArray[np.integer], weights: LevelWeights) -> SelectionPlan:
    """Group candidates into levels of equal deviation and turn ``weights(counts, deviations)``
    into the inverse-CDF thresholds: each level's probability within 2**-64 of its exact
    share of the integer weights."""
    devs = np.asarray(deviations)
    m = devs.shape[0]
    if m == 0 or m >= _MAX_CANDIDATES:
        raise InternalError(f"cannot sample among {m} candidates")
    order = np.argsort(devs, kind="stable").astype(np.int64)
    # np.unique, not np.bincount: the time must not grow with the largest deviation.
    values, sizes = np.unique(devs, return_counts=True)
    level_devs = [int(d) for d in values.tolist()]
    counts = [int(c) for c in sizes.tolist()]
    scaled = weights(counts, level_devs)
    total = sum(scaled)
    if len(scaled) != len(counts) or min(scaled) < 0 or total <= 0:
        raise InternalError("level weights must be one non-negative integer per level")
    thresholds: list[int] = []
    cumulative = 0
    for weight in scaled[:-1]:
        cumulative += weight
        threshold = -((-cumulative * _TWO64) // total)  # ceil(cumulative / total * 2**64)
        if threshold >= _TWO64:
            break
        thresholds.append(threshold)
    starts = tuple(np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64).tolist())
    return SelectionPlan(
        m=m,
        order=order,
        starts=starts,
        counts=tuple(counts),
        thresholds=tuple(thresholds),
        deviations=tuple(level_devs),
    )


def draw(plan: SelectionPlan, words: npt.NDArray[np.uint64]) -> int:
    """Select one candidate index from four random 64-bit words (see the module docstring)."""
    w0, w1, r_hi, r_lo = (int(w) for w in words)
    r = (r_hi << 64) | r_lo
    if w0 < _FLOOR_CUTOFF:
        return (r * plan.m) >> 128
    level = bisect_right(plan.thresholds, w1)
    within = (r * plan.counts[level]) >> 128
    return int(plan.order[plan.starts[level] + within])


def _mulhi128(
    r_hi: npt.NDArray[np.uint64], r_lo: npt.NDArray[np.uint64], n: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    """``floor((r_hi * 2**64 + r_lo) * n / 2**128)`` for n < 2**32, in uint64 without overflow."""
    mask = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    carry = ((r_lo >> s32) * n + (((r_lo & mask) * n) >> s32)) >> s32  # floor(r_lo * n / 2**64)
    return ((r_hi >> s32) * n + (((r_hi & mask) * n + carry) >> s32)) >> s32


def draw_many(plan: SelectionPlan, words: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """Vectorised :func:`draw` over an (n, 4) array of words; identical results draw by draw."""
    words = np.asarray(words, dtype=np.uint64)
    floor = words[:, 0] < np.uint64(_FLOOR_CUTOFF)
    level = np.searchsorted(np.asarray(plan.thresholds, dtype=np.uint64), words[:, 1], side="right")
    counts = np.asarray(plan.counts, dtype=np.uint64)[level]
    starts = np.asarray(plan.starts, dtype=np.int64)[level]
    within = _mulhi128(words[:, 2], words[:, 3], counts).astype(np.int64)
    chosen = plan.order[starts + within]
    uniform = _mulhi128(words[:, 2], words[:, 3], np.full(len(words), plan.m, dtype=np.uint64))
    return np.where(floor, uniform.astype(np.int64), chosen)
