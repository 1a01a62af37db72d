"""A lower bound on the privacy loss of a pair of neighbouring inputs, from samples alone.

The distinguishing game of black-box DP auditing (StatDP, Ding et al. 2018; DP-Sniper,
Bichsel et al. 2021): draw outputs of the service on D and on D', choose an output event S on
one half of the samples, and on the other half bound ``ln P_D(S) - ln P_D'(S)`` from below
with Clopper-Pearson intervals. Choosing S on data the estimate never sees keeps the bound
valid. Both directions (D over D', D' over D) are tried with a Bonferroni split of the
confidence, so with probability at least ``confidence`` the reported bound is at most the true
privacy loss of the pair: a bound above the declared epsilon proves the service broken.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import beta

MAX_EVENT_SIZE = 64
"""Events are the top outcomes by ratio; at most this many are tried."""


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """One-sided (lower, upper) Clopper-Pearson bounds, each holding with probability 1 - alpha."""
    lower = 0.0 if successes == 0 else float(beta.ppf(alpha, successes, trials - successes + 1))
    upper = (
        1.0
        if successes == trials
        else float(beta.ppf(1 - alpha, successes + 1, trials - successes))
    )
    return lower, upper


def ratio_bound(hits: int, other_hits: int, trials: int, other_trials: int, alpha: float) -> float:
    """``ln(lower(P) / upper(Q))``: a lower bound on ``ln P(S) - ln Q(S)`` (0 if none)."""
    lower, _ = clopper_pearson(hits, trials, alpha / 2)
    _, upper = clopper_pearson(other_hits, other_trials, alpha / 2)
    if lower <= 0 or upper <= 0:
        return 0.0
    return max(0.0, math.log(lower / upper))


@dataclass(frozen=True)
class Bound:
    """The audit's answer for one pair: the lower bound and how it was found."""

    epsilon_lower: float
    event: tuple[int, ...]
    direction: str
    samples: int


def choose_event(first: Sequence[int], second: Sequence[int], alpha: float) -> tuple[int, ...]:
    """The set of outcomes that best separates ``first`` from ``second`` on these samples."""
    a, b = Counter(first), Counter(second)
    ranked = sorted(a, key=lambda o: (-(a[o] + 0.5) / (b[o] + 0.5), o))[:MAX_EVENT_SIZE]
    best: tuple[int, ...] = ()
    best_score = -1.0
    hits = other = 0
    for size, outcome in enumerate(ranked, start=1):
        hits += a[outcome]
        other += b[outcome]
        score = ratio_bound(hits, other, len(first), len(second), alpha)
        if score > best_score:
            best, best_score = tuple(ranked[:size]), score
    return best


def event_bound(
    outcomes_d: Sequence[int],
    outcomes_d2: Sequence[int],
    event: set[int],
    confidence: float,
    reverse: bool = False,
) -> Bound:
    """The bound for an event chosen without looking at the samples (from public knowledge
    such as the bundle's exact probabilities): every sample estimates it. ``reverse``: the
    event is one that D' raises over D, so the bound is on ``ln P_D'(S) - ln P_D(S)``."""
    first, second = (outcomes_d2, outcomes_d) if reverse else (outcomes_d, outcomes_d2)
    hits = sum(o in event for o in first)
    other = sum(o in event for o in second)
    bound = ratio_bound(hits, other, len(first), len(second), 1 - confidence)
    direction = "public event, D' over D" if reverse else "public event, D over D'"
    return Bound(bound, tuple(sorted(event)), direction, len(outcomes_d) + len(outcomes_d2))


def lower_bound(
    outcomes_d: Sequence[int],
    outcomes_d2: Sequence[int],
    confidence: float = 0.95,
    raised: Sequence[set[int]] = (),
    lowered: Sequence[set[int]] = (),
) -> Bound:
    """A lower bound on the pair's privacy loss, valid with probability ``confidence``: the
    best of events chosen on half of the samples (both directions) and of public events
    (chosen without the samples): ``raised``, events D raises over D', each tested as D over
    D', and ``lowered``, events D' raises over D, tested as D' over D. The confidence is split
    between all of them."""
    public = [(event, False) for event in raised] + [(event, True) for event in lowered]
    tries = 2 + len(public)
    best = _split_bound(outcomes_d, outcomes_d2, 1 - (1 - confidence) * 2 / tries)
    for event, reverse in public:
        found = event_bound(outcomes_d, outcomes_d2, event, 1 - (1 - confidence) / tries, reverse)
        if found.epsilon_lower > best.epsilon_lower:
            best = found
    return best


def _split_bound(outcomes_d: Sequence[int], outcomes_d2: Sequence[int], confidence: float) -> Bound:
    alpha = (1 - confidence) / 2  # two directions
    half_d, half_d2 = len(outcomes_d) // 2, len(outcomes_d2) // 2
    best = Bound(0.0, (), "none", len(outcomes_d) + len(outcomes_d2))
    for name, (x, y), (nx, ny) in (
        ("D over D'", (outcomes_d, outcomes_d2), (half_d, half_d2)),
        ("D' over D", (outcomes_d2, outcomes_d), (half_d2, half_d)),
    ):
        event = set(choose_event(x[:nx], y[:ny], alpha))
        held_x, held_y = x[nx:], y[ny:]
        hits = sum(o in event for o in held_x)
        other = sum(o in event for o in held_y)
        bound = ratio_bound(hits, other, len(held_x), len(held_y), alpha)
        if bound > best.epsilon_lower:
            best = Bound(bound, tuple(sorted(event)), name, best.samples)
    return best


def fit_pvalue(
    outcomes: Sequence[int], probabilities: Sequence[float], minimum: float = 5.0
) -> float:
    """Chi-square p-value of ``outcomes`` (indices) against the exact ``probabilities``.

    Outcomes are grouped, in order of probability, into cells that each expect at least
    ``minimum`` draws, so the test is valid for thousands of rarely drawn candidates. A tiny
    p-value says the deployment does not draw from the distribution the bundle defines (a
    different model, a broken mechanism), whether or not that breaks the privacy bound.
    """
    import numpy as np
    from scipy.stats import chisquare

    p = np.asarray(probabilities, dtype=np.float64)
    drawn = np.asarray(outcomes, dtype=np.int64)
    if len(drawn) and ((drawn < 0) | (drawn >= len(p))).any():
        return 0.0  # not an outcome at all (a negative index would wrap onto a real one)
    if len(drawn) and (p[drawn] <= 0).any():
        return 0.0  # an outcome the distribution never produces
    n = len(outcomes)
    order = np.argsort(-p, kind="stable")
    cell_of = np.empty(len(p), dtype=np.int64)
    cells: list[float] = []
    running = 0.0
    for index in order:
        if not cells or running >= minimum:
            cells.append(0.0)
            running = 0.0
        cell_of[index] = len(cells) - 1
        cells[-1] += p[index] * n
        running += p[index] * n
    if len(cells) > 1 and cells[-1] < minimum:  # fold an underfilled tail into its neighbour
        cell_of[cell_of == len(cells) - 1] = len(cells) - 2
        tail = cells.pop()
        cells[-1] += tail
    if len(cells) < 2:
        return 1.0
    observed = np.bincount(cell_of[drawn], minlength=len(cells))
    expected = np.asarray(cells) * n / sum(cells)
    return float(chisquare(observed, expected).pvalue)


def range_bound(
    outcomes_d: Sequence[int],
    outcomes_d2: Sequence[int],
    raised: set[int],
    lowered: set[int],
    confidence: float,
) -> float:
    """A lower bound on the pair's privacy-loss range: ``ln P(E1)/Q(E1) - ln P(E2)/Q(E2)``
    for public events E1 (``raised`` by D over D') and E2 (``lowered``), P the outcomes of
    D and Q those of D'. An event's log ratio lies between its outcomes' extremes, so this
    is below ``sup_o L(o) - inf_o L(o)``, which an epsilon-bounded-range mechanism (the
    premise of rho = epsilon**2 / 8 in zCDP) keeps at or below epsilon."""
    alpha = (1 - confidence) / 2  # two events
    n, n2 = len(outcomes_d), len(outcomes_d2)
    up = ratio_bound(_hits(outcomes_d, raised), _hits(outcomes_d2, raised), n, n2, alpha)
    down = ratio_bound(_hits(outcomes_d2, lowered), _hits(outcomes_d, lowered), n2, n, alpha)
    return up + down


def _hits(outcomes: Sequence[int], event: set[int]) -> int:
    return sum(o in event for o in outcomes)
