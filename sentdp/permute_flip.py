"""Permute-and-flip: exact level probabilities, for selections among a few outcomes.

Permute-and-flip (McKenna and Sheldon, NeurIPS 2020) visits the outcomes in a uniformly random
order and stops at outcome c with probability ``exp(eps * (u_c - u_max) / (2 * sensitivity))``.
It is eps-DP under the same condition as the exponential mechanism, and its expected utility
is never worse and up to twice as good in eps: where the exponential mechanism is nearly
uniform (small eps, few votes) it roughly halves the epsilon needed for the same accuracy.

It equals report-noisy-max with exponential noise (Ding et al., 2021), which gives the closed
form used here. With gaps ``g_c = eps * (u_max - u_c) / (2 * sensitivity) >= 0`` and
``a_c = exp(-g_c)`` (the leader's a is 1),

    P(c) = a_c * integral_0^1 prod_{j != c} (1 - a_j x) dx,

a polynomial integral. This module evaluates it *exactly* in integers for a_c rounded to
multiples of 2**-64 (:func:`flip_probabilities`); :func:`flip_slack` bounds what the rounding
can cost. Each level's weight is an integer, so :func:`sentdp.sampling.plan_levels` turns them
into thresholds exactly as it does for the exponential mechanism, floor included.

Cost: O(r**2) products of integers of O(64 r) bits for r outcomes, which suits a label (r
classes), not DeepCandidate's thousands of candidates.
"""

from __future__ import annotations

import math

from sentdp.errors import InternalError
from sentdp.sampling import GAMMA, SAMPLER_ABS_ERROR

FRACTION_BITS = 64
"""Each ``a_c`` is rounded to a multiple of ``2**-FRACTION_BITS`` before the exact integral."""
_ONE = 1 << FRACTION_BITS
_MAX_OUTCOMES = 1024


def flip_probabilities(counts: list[int], gaps: list[tuple[float, float]]) -> tuple[list[int], int]:
    """Exact permute-and-flip level masses: ``(weights, total)`` with level L drawn with
    probability ``weights[L] / total`` (its ``counts[L]`` outcomes equally).

    ``gaps[L]`` is level L's gap ``g_L`` as an unevaluated sum ``(hi, lo)`` (see
    :func:`sentdp.sampling.exact_product`); the first level must be the leaders' (gap 0).
    ``a_L = exp(-hi) * (1 - lo)`` carries ~2 ulp of relative error and is then rounded to
    ``A_L / 2**64`` (at least 1 / 2**64); the weights are exact for those rounded values and
    ``sum(weights) == total``.
    """
    if not counts or len(counts) != len(gaps) or min(counts) < 1:
        raise InternalError("permute-and-flip needs one positive count and one gap per level")
    outcomes = sum(counts)
    if outcomes > _MAX_OUTCOMES:
        raise InternalError(f"permute-and-flip is exact for at most {_MAX_OUTCOMES} outcomes")
    if gaps[0] != (0.0, 0.0):
        raise InternalError("the first level must hold the leaders (gap 0)")
    scaled = [_ONE] + [_rounded_exp(hi, lo) for hi, lo in gaps[1:]]
    # F(x) = prod_L (2**64 - A_L x)**n_L: coefficients of x**k, scaled by 2**(64 * outcomes).
    full = [1]
    for a, n in zip(scaled, counts, strict=True):
        for _ in range(n):
            full = _times_factor(full, a)
    lcm = math.lcm(*range(1, outcomes + 1))
    shares = [lcm // (k + 1) for k in range(outcomes)]
    weights = []
    for a, n in zip(scaled, counts, strict=True):
        # prod_{j != c} for an outcome c of this level is F / (2**64 - A x), exactly. It is
        # recomputed for every outcome of the level, so the time depends on r alone, not on
        # how many tallies tie (a document's levels would otherwise show in the latency).
        mass = 0
        for _ in range(n):
            rest = _divide_by_factor(full, a)
            mass += a * sum(c * s for c, s in zip(rest, shares, strict=True))
        weights.append(mass)
    total = lcm << (FRACTION_BITS * outcomes)
    if sum(weights) != total or min(weights) < 0:
        # The masses sum to 1 - prod(1 - a_c) = 1 because the leader's a is exactly 1.
        raise InternalError("permute-and-flip level masses do not sum to one")
    return weights, total


def flip_slack(outcomes: int) -> float:
    """eta for permute-and-flip over ``outcomes`` outcomes: the epsilon the float error costs.

    Per outcome, the sampled probability is within ``(r + 1) * 2**-50`` of the exact
    mechanism's. Rounding each a_j (relative error 2**-51, then at most 2**-64 absolute, so
    ``|da_j| <= 2**-50``) moves P(c) by at most ``|da_c| + sum_{j != c} |da_j| / 2`` (every
    factor of the integrand lies in [0, 1]), that is <= r * 2**-50; the thresholds add
    2**-63. With the floor gamma every probability is >= gamma / r, so neighbouring
    probabilities are off by a factor within ``1 +- delta``.
    """
    delta = (outcomes + 1) * SAMPLER_ABS_ERROR * outcomes / GAMMA
    if not 0 < delta < 0.5:
        raise InternalError(f"cannot run permute-and-flip over {outcomes} outcomes")
    return math.log1p(delta) - math.log1p(-delta)


def _rounded_exp(hi: float, lo: float) -> int:
    """``round(exp(-(hi + lo)) * 2**64)`` to within one unit plus ~2 ulp of the float exp."""
    if not (math.isfinite(hi) and hi >= 0):
        raise InternalError(f"a permute-and-flip gap must be finite and >= 0, got {hi!r}")
    value = math.exp(-hi) * (1.0 - lo)
    # Never 0: an outcome far behind costs the same big-integer work as a near one (at most
    # 2**-64 more error than rounding to nearest, within the bound of flip_slack).
    return max(1, min(_ONE, round(math.ldexp(value, FRACTION_BITS))))


def _times_factor(poly: list[int], a: int) -> list[int]:
    """``poly(x) * (2**64 - a x)``."""
    out = [c << FRACTION_BITS for c in poly] + [0]
    for k, c in enumerate(poly):
        out[k + 1] -= a * c
    return out


def _divide_by_factor(poly: list[int], a: int) -> list[int]:
    """``poly(x) / (2**64 - a x)`` for a poly that the factor divides (synthetic division)."""
    quotient = []
    carry = 0
    for c in poly[:-1]:
        value = c + a * carry
        if value & (_ONE - 1):
            raise InternalError("permute-and-flip polynomial division is not exact")
        carry = value >> FRACTION_BITS
        quotient.append(carry)
    if poly[-1] != -a * carry:
        raise InternalError("permute-and-flip polynomial division is not exact")
    return quotient
