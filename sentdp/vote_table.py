"""A selection rule for short documents: the best epsilon-SentDP table over hard votes.

A *hard vote* gives a sentence's whole vote to one class (its likeliest, a function of that
sentence alone), so an n-sentence document's votes are per-class counts summing to n, and a
neighbouring document (one sentence replaced; n is shared) moves at most one vote from one
class to another. A selection rule symmetric in the classes is then a table ``f(lam, t)``:
the probability of releasing a class that holds t votes when the sorted non-zero counts are
the partition ``lam`` of n. It is a distribution when ``sum_t mult(lam, t) f(lam, t) = 1`` and
epsilon-SentDP when ``f(lam, t) <= e^epsilon f(lam', t')`` for every neighbour ``lam'`` and
every class (count t before, t' after). Both are linear, so the table of largest *mean
chance of releasing a plurality class, every histogram counted once* is a linear program
that depends on (n, r, epsilon) alone: no data is fitted, so nothing about any corpus is in it.

Why: the exponential mechanism and permute-and-flip spend epsilon / 2 per vote, because in
general one replaced sentence can raise one class's tally and lower another's. With counts
that sum to n the program can do much better for short documents: a unanimous 3-sentence
document of 13 classes gets its class with probability e^3 / (e^3 + 12) = 0.626 at epsilon 1,
group privacy's bound, against 0.272 from the exponential mechanism. Measured on clothing
reviews' validation split (docs/utility.md, "A table for short documents"), it is ahead of the cube
vote for short documents at epsilon <= 3 and behind it for long ones, where graded votes
count for more than the better rule.

Exactness. The program runs at ``eps' - LP_MARGIN`` (``eps'`` = ``epsilon - eta(r)``, the
vote's own slack, :func:`table_epsilon`; at most ``LP_CAP``); its solution is rounded to
integer weights, mixed with the floor (gamma / r for every class, as every draw), and every
neighbour pair is checked in rational arithmetic against a rational lower bound of
``e^eps'``. A table that fails the check is never made (:class:`~sentdp.errors.InternalError`).
The sampler draws each level within 2**-63 of its exact share
(:func:`~sentdp.sampling.plan_levels`), covered by eta(r) as for permute-and-flip.
The table's log ratios are not range-bounded: a zCDP draw keeps the standard exponential
mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from sentdp.errors import InputError, InternalError
from sentdp.mechanism import epsilon_less_slack
from sentdp.permute_flip import flip_slack
from sentdp.sampling import GAMMA, SelectionPlan, plan_levels

Partition = tuple[int, ...]
"""Vote counts of the classes that hold any, largest first."""
Entry = tuple[Partition, int]
"""A table entry: the histogram and one class's count in it."""

LONGEST = 10
"""Tables are made for documents of at most this many sentences (the program grows with the
partitions of n: 42 for n = 10, about 0.3 s to solve at 13 classes)."""

MOST_CLASSES = 32
"""Tables are made for at most this many classes (the neighbour pairs grow with r**3), the
classes a vote is drawn by permute-and-flip for, whose slack the table shares."""

LP_MARGIN = 2e-3
"""The program runs this far below the epsilon the table is checked at: its solution meets
each constraint to within about 1e-10, which, against probabilities of at least gamma / r,
needs a relative margin of about 1e-3."""

LP_CAP = 10.0
"""The program runs at no more than this epsilon: above it a short document's plurality is
released with probability within 1e-3 of 1 anyway, and the program's coefficients
(``e^epsilon``) would grow past what the solver handles reliably. A table made below the
epsilon charged is still epsilon-SentDP."""

CAP_KEY = 16.0
"""Every epsilon from this grid point up gets the table made here (the program runs at
``LP_CAP`` for all of them): one table, not one per grid point above it."""

EPSILON_STEPS = 16
"""Tables are made at epsilons ``2**(k / EPSILON_STEPS)``, a request's epsilon rounded down to
the nearest (at most 4.4% less): a caller who varies epsilon from request to request cannot
make the worker solve a new program each time, and a table made below the epsilon charged
is still epsilon-SentDP."""

WEIGHT_BITS = 52
"""Table probabilities are rounded to integers of this many bits."""


def partitions(n: int, largest: int | None = None) -> Iterator[Partition]:
    """Every partition of n into parts of at most ``largest``, parts in decreasing order."""
    if n == 0:
        yield ()
        return
    for part in range(min(n, largest or n), 0, -1):
        for rest in partitions(n - part, part):
            yield (part, *rest)


def histogram(counts: Sequence[int]) -> Partition:
    """The partition of a vector of per-class counts."""
    return tuple(sorted((int(c) for c in counts if c), reverse=True))


def histograms(n: int, classes: int) -> Iterator[tuple[Partition, list[int]]]:
    """Every histogram of n votes over ``classes``, and its counts padded with zeros."""
    for lam in partitions(n):
        if len(lam) <= classes:
            yield lam, list(lam) + [0] * (classes - len(lam))


def entries(n: int, classes: int) -> list[Entry]:
    """Every ``(lam, t)`` of a table for n-sentence documents over ``classes`` classes."""
    return [(lam, t) for lam, full in histograms(n, classes) for t in sorted(set(full))]


def multiplicity(entry: Entry, classes: int) -> int:
    """How many classes hold ``t`` votes in ``lam``."""
    lam, t = entry
    return lam.count(t) if t else classes - len(lam)


def neighbour_pairs(n: int, classes: int) -> set[tuple[Entry, Entry]]:
    """Every ``((lam, t), (lam', t'))``: one class's entry before and after one vote moves
    between two classes (the replaced sentence's), for every class."""
    pairs = set()
    for lam, full in histograms(n, classes):
        for a in range(classes):
            if full[a] == 0:
                continue
            for b in range(classes):
                if b == a:
                    continue
                moved = list(full)
                moved[a] -= 1
                moved[b] += 1
                after = histogram(moved)
                for c in range(classes):
                    pairs.add(((lam, full[c]), (after, moved[c])))
    return pairs


@dataclass(frozen=True)
class HardVoteTable:
    """An epsilon-SentDP selection table for ``sentences``-sentence documents: each entry's
    integer weight, relative to its histogram's total, before the floor. Its weights are
    read-only and checked exactly when it is made (:func:`check`), so a table that exists
    is one that passed."""

    sentences: int
    classes: int
    epsilon: float
    """The guarantee, slack included (what a request is charged)."""
    weights: Mapping[Entry, int]
    _probabilities: Mapping[Entry, Fraction] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        if set(self.weights) != set(entries(self.sentences, self.classes)):
            raise InternalError("a table needs one weight for every entry")
        if min(self.weights.values()) < 0:
            raise InternalError("a table's weights are integers >= 0")
        exact = {entry: self._exact(entry) for entry in self.weights}
        object.__setattr__(self, "_probabilities", MappingProxyType(exact))
        check(self, _checked_at(self.epsilon, self.classes))

    def total(self, lam: Partition) -> int:
        """The weights of every class of histogram ``lam``, summed."""
        return sum(
            self.weights[(lam, t)] * multiplicity((lam, t), self.classes)
            for t in set(lam) | ({0} if len(lam) < self.classes else set())
        )

    def exact(self, entry: Entry) -> Fraction:
        """The exact probability of releasing one class of ``entry``, the floor included
        (computed once, when the table is made)."""
        return self._probabilities[entry]

    def _exact(self, entry: Entry) -> Fraction:
        r = self.classes
        share = Fraction(self.weights[entry], self.total(entry[0]))
        return Fraction(GAMMA) / r + (1 - Fraction(GAMMA)) * share

    def _counts(self, counts: Sequence[int]) -> list[int]:
        if any(isinstance(c, bool) or int(c) != c for c in counts):
            raise InputError(f"hard-vote counts are integers, got {list(counts)}")
        values = [int(c) for c in counts]
        if len(values) != self.classes or min(values) < 0 or sum(values) != self.sentences:
            raise InputError(
                f"a table for {self.sentences}-sentence documents over {self.classes} classes "
                f"needs {self.classes} counts >= 0 summing to {self.sentences}, got {values}"
            )
        return values

    def plan(self, counts: Sequence[int]) -> SelectionPlan:
        """The sampler's plan for a document whose hard votes are ``counts`` (one per class)."""
        values = self._counts(counts)
        lam, top = histogram(values), max(values)

        def weights(sizes: list[int], deviations: list[int]) -> list[int]:
            return [
                self.weights[(lam, top - d)] * size
                for size, d in zip(sizes, deviations, strict=True)
            ]

        return plan_levels(np.array([top - c for c in values], dtype=np.int64), weights)

    def probabilities(self, counts: Sequence[int]) -> npt.NDArray[np.float64]:
        """(r,) each class's probability, the floor included (exact to float rounding)."""
        values = self._counts(counts)
        lam = histogram(values)
        return np.array([float(self.exact((lam, c))) for c in values], dtype=np.float64)


def _exp_below(x: float) -> Fraction:
    """A rational at most ``e^x`` for ``0 <= x <= LP_CAP + LP_MARGIN``: a partial sum of its
    Taylor series (every term is positive), within 1e-40 relative of it there; no float
    ``exp`` enters."""
    if not 0 <= x <= LP_CAP + LP_MARGIN:
        raise InternalError(f"no exact lower bound of e^x for x={x!r}")
    power, total = Fraction(1), Fraction(1)
    for k in range(1, 80):
        power = power * Fraction(x) / k
        total += power
    return total


def table_epsilon(epsilon: float, classes: int) -> float:
    """``epsilon - eta(r)``, eta(r) the vote's own slack (permute-and-flip's, which covers
    the sampler's 2**-63 per level): what a table of guarantee ``epsilon`` must meet exactly."""
    slack = flip_slack(classes)
    return epsilon_less_slack(epsilon, slack, f"the vote's float slack for {classes} classes")


def _checked_at(epsilon: float, classes: int) -> float:
    """The epsilon a table of guarantee ``epsilon`` is checked at: :func:`table_epsilon`, or
    the cap's (stricter), where the program ran no higher."""
    return min(table_epsilon(epsilon, classes), LP_CAP + LP_MARGIN)


def check(table: HardVoteTable, epsilon: float) -> None:
    """Raise :class:`InternalError` unless every neighbour ratio of the table's exact
    probabilities (floor included) is at most ``e^epsilon``. (Each histogram's probabilities
    sum to 1 by construction: each weight is taken relative to its histogram's total.)"""
    bound = _exp_below(epsilon)
    for before, after in neighbour_pairs(table.sentences, table.classes):
        if table.exact(before) > bound * table.exact(after):
            raise InternalError(
                f"the table for n={table.sentences}, r={table.classes}, epsilon="
                f"{table.epsilon!r} exceeds e^epsilon between {before} and {after}"
            )


def _solve(sentences: int, classes: int, epsilon: float) -> dict[Entry, float]:
    """The program's solution at ``epsilon``: for each entry, the probability of one class."""
    from scipy.optimize import linprog
    from scipy.sparse import lil_matrix

    keys = entries(sentences, classes)
    index = {key: j for j, key in enumerate(keys)}
    pairs = sorted(neighbour_pairs(sentences, classes))
    bound = math.exp(epsilon)
    upper = lil_matrix((len(pairs), len(keys)))
    for k, (before, after) in enumerate(pairs):  # pairs hold both directions
        upper[k, index[before]], upper[k, index[after]] = 1.0, -bound
    states = sorted({lam for lam, _ in keys})
    equal = lil_matrix((len(states), len(keys)))
    for s, lam in enumerate(states):
        for key in keys:
            if key[0] == lam:
                equal[s, index[key]] = multiplicity(key, classes)
    objective = np.zeros(len(keys))
    for lam in states:  # one plurality class of every histogram
        objective[index[(lam, lam[0])]] = -1.0
    solved = linprog(
        objective,
        A_ub=upper.tocsr(),
        b_ub=np.zeros(len(pairs)),
        A_eq=equal.tocsr(),
        b_eq=np.ones(len(states)),
        bounds=(0.0, 1.0),
        method="highs",
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if solved.status != 0:
        raise InternalError(f"the table's program for n={sentences} failed: {solved.message}")
    return {key: float(solved.x[j]) for key, j in index.items()}


def makes_table(sentences: int, classes: int, epsilon: float) -> bool:
    """Whether :func:`hard_vote_table` makes a table for these numbers (a public rule: a
    document it refuses is drawn by the vote's own rule)."""
    try:
        hard_vote_table(sentences, classes, epsilon)
    except InputError:
        return False
    return True


def hard_vote_table(sentences: int, classes: int, epsilon: float) -> HardVoteTable:
    """The table for ``sentences``-sentence documents over ``classes`` classes, epsilon-SentDP
    (slack included): made at :func:`grid_epsilon` of ``epsilon``, its :attr:`epsilon`, and
    checked exactly when made; cached, since it depends on these three numbers alone
    (validated before the cache is consulted)."""
    for name, value in (("sentences", sentences), ("classes", classes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"a table's {name} is an integer, got {value!r}")
    if not 1 <= sentences <= LONGEST:
        raise InputError(f"tables are made for 1 to {LONGEST} sentences, got {sentences}")
    if not 2 <= classes <= MOST_CLASSES:
        raise InputError(f"tables are made for 2 to {MOST_CLASSES} classes, got {classes}")
    table_epsilon(epsilon, classes)  # a finite number above the slack, or InputError
    made_at = min(grid_epsilon(float(epsilon)), CAP_KEY)
    if table_epsilon(made_at, classes) <= 2 * LP_MARGIN:
        raise InputError(f"a table needs epsilon above {2 * LP_MARGIN:g} plus the vote's slack")
    return _table(sentences, classes, made_at)


def grid_epsilon(epsilon: float) -> float:
    """The largest ``2**(k / EPSILON_STEPS)`` at most ``epsilon`` (> 0): what a table for a
    request at ``epsilon`` is made at."""
    k = math.floor(EPSILON_STEPS * math.log2(epsilon))
    while 2.0 ** ((k + 1) / EPSILON_STEPS) <= epsilon:  # log2's rounding, either way
        k += 1
    while 2.0 ** (k / EPSILON_STEPS) > epsilon:
        k -= 1
    return float(2.0 ** (k / EPSILON_STEPS))


@lru_cache(maxsize=4096)
def _table(sentences: int, classes: int, epsilon: float) -> HardVoteTable:
    solution = _solve(sentences, classes, _checked_at(epsilon, classes) - LP_MARGIN)
    scale = 1 << WEIGHT_BITS
    weights = {key: round(min(max(p, 0.0), 1.0) * scale) for key, p in solution.items()}
    return HardVoteTable(sentences, classes, epsilon, weights)  # checked as it is made
