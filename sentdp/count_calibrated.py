"""The exponential mechanism over vote tallies, calibrated to the document's sentence count.

Neighbouring documents have the same number n of sentences (README, "Unit of privacy"), so a
vote's selection may depend on n. Each sentence's vote lies in ``{v in Z^r : v >= 0,
sum(v) <= U}`` (U = :data:`sentdp.labels.VOTE_UNITS`), so the tallies of an n-sentence
document are bounded together, by n U in all, which the usual analysis of the exponential
mechanism ignores. For ``P(c) proportional to exp(beta * tally_c)`` with ``z = beta U``, the
largest privacy loss over every pair of n-sentence neighbours and every outcome is

    L_n(z) = z + ln((e^(n z) + r - 1) / (e^((n-1) z) + e^z + r - 2)),

reached when the replaced vote moves from all-for-c to all-for-b while the other n - 1
sentences all vote b. Proof, for outcome c, other votes summing to W (any point of
``W >= 0, sum(W) <= (n-1) U``), replaced vote v and replacement v':
``loss = beta (v_c - v'_c) + lse(beta (W + v')) - lse(beta (W + v))``.
(1) It grows with v_c and falls with every other v_d (the derivatives are
``beta (1 - p_c) >= 0`` and ``-beta p_d <= 0``), so v = U e_c. (2) It is convex in v', so v'
is a vertex: 0, U e_c (loss 0) or U e_b, b != c, and U e_b is never below 0. (3) With
``S = sum_d e^(beta W_d)`` and ``a = e^z - 1`` the loss is
``z + ln(S + a e^(beta W_b)) - ln(S + a e^(beta W_c))``; it falls with W_c everywhere, and
where ``W_b >= W_c`` it rises with W_b and falls with
every other W_d, so moving all of W onto b, up to (n-1) U, never lowers it (where
``W_b < W_c`` the loss is below z, its value at W = 0).

``L_1(z) = z`` (twice the standard exponential mechanism's allowance) and ``L_n(z)`` tends to
the standard ``2 z`` as n grows. :func:`count_rate` gives the largest z with
``L_n(z) <= epsilon``; :func:`uses_count_rate` is the public rule that decides, from (n,
epsilon, r) alone, whether a document of n sentences is drawn this way or by
permute-and-flip (which is better for longer documents).
"""

from __future__ import annotations

import math
from functools import lru_cache

from sentdp.errors import InternalError

LOSS_MARGIN = 1e-9
"""Evaluated losses must clear epsilon by this relative margin plus as much absolute: the
float error of :func:`count_loss` is about ``n z 2**-52``, below 3e-10 while
``n z <= MAX_SCALE``."""

MAX_SCALE = 1e6
"""Above ``n epsilon`` this large the rate is the standard ``epsilon / 2`` (L_n(z) is within
float error of 2 z there anyway)."""


def _log_sum_exp(terms: list[float]) -> float:
    top = max(terms)
    return top + math.log(math.fsum(math.exp(t - top) for t in terms))


def count_loss(z: float, sentences: int, classes: int) -> float:
    """``L_n(z)``: the exponential mechanism's worst privacy loss over n-sentence neighbours
    when a whole vote (U units) moves a class's score by ``z``."""
    if sentences < 1 or classes < 2 or not (math.isfinite(z) and z >= 0):
        raise InternalError(f"no count loss for z={z!r}, n={sentences}, r={classes}")
    n = sentences
    numerator = _log_sum_exp([n * z, math.log(classes - 1)])
    below = [(n - 1) * z, z] + ([math.log(classes - 2)] if classes > 2 else [])
    return z + numerator - _log_sum_exp(below)


@lru_cache(maxsize=4096)
def count_rate(epsilon: float, sentences: int, classes: int) -> float:
    """The largest z (to within 2**-40 relative) with ``L_n(z) <= epsilon``, never below the
    standard ``epsilon / 2``; ``epsilon`` is what the selection runs at (after the slack)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InternalError(f"count_rate needs a finite epsilon > 0, got {epsilon!r}")
    limit = epsilon * (1 - LOSS_MARGIN) - LOSS_MARGIN

    def fits(z: float) -> bool:
        return count_loss(z, sentences, classes) <= limit

    low, high = epsilon / 2, epsilon  # L_n(z) >= z, so nothing above epsilon fits
    if sentences * epsilon > MAX_SCALE or not fits(low):  # the standard bound holds
        return low
    for _ in range(60):
        middle = (low + high) / 2
        if fits(middle):
            low = middle
        else:
            high = middle
        if high - low <= low * 2**-40:
            break
    return low


def _log_miss_exponential(z: float, behind: float, classes: int) -> float:
    """ln P(not the leader) for ``P(c) ~ exp(z tally_c / U)`` when the r - 1 others are
    ``behind`` whole votes back."""
    log_others = math.log(classes - 1) - z * behind
    return log_others - math.log1p(math.exp(log_others))


def _log_miss_flip(epsilon: float, behind: float, classes: int) -> float:
    """ln P(not the leader) for permute-and-flip at ``epsilon`` (sensitivity one vote), the
    others ``behind`` whole votes back: the leader is kept iff every class visited before it
    flips tails, ``P = (1 - (1 - q)**r) / (r q)`` with ``q = exp(-epsilon behind / 2)``; for
    small q, ``1 - P = (r - 1) q / 2 (1 - (r - 2) q / 3) + O(q**3)``."""
    log_q = -epsilon * behind / 2
    q = math.exp(log_q)
    if q > 1e-6:
        return math.log1p(math.expm1(classes * math.log1p(-q)) / (classes * q))
    return math.log((classes - 1) / 2) + log_q + math.log1p(-(classes - 2) * q / 3)


@lru_cache(maxsize=4096)
def uses_count_rate(epsilon: float, sentences: int, classes: int) -> bool:
    """Whether an n-sentence document's vote is drawn by the count-calibrated exponential
    mechanism rather than permute-and-flip: where it gives a document whose leader is n/2
    whole votes ahead of every other class (a middling lead for n sentences) the higher
    probability of the leader (compared as the logs of the probabilities of missing it,
    which stay exact where both probabilities round to 1; ties go to permute-and-flip). A
    function of public values only; ``epsilon`` is what the selection runs at."""
    behind = sentences / 2
    z = count_rate(epsilon, sentences, classes)
    return _log_miss_exponential(z, behind, classes) < _log_miss_flip(epsilon, behind, classes)
