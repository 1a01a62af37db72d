"""Privacy accounting rules, apart from any storage: what a document costs, what is admitted.

* A document privatized at epsilon costs ``charge_for(epsilon)`` micro-epsilon: the decimal
  value of epsilon (its shortest repr) times 10**6, rounded UP. The mechanism then runs at
  ``epsilon_of_charge(charge)``, the largest float not above ``charge / 10**6``, so the
  epsilon actually spent never exceeds the epsilon charged, to the last bit.
* Basic sequential composition: a user's account holds the sum of the charges of every
  document privatized for them. No parallel composition across documents is assumed (one
  user's documents may repeat sentences), and it holds for adaptively chosen epsilons with
  the stopping rule below.
* Group privacy: a tenant protects groups of g sentence positions, which costs g times the
  sum. A document is admitted when ``g * (spent + charge) <= budget``, all in micro-epsilon
  (the budget is rounded DOWN to micro-epsilon).
* Other accountants (:class:`Policy`): zCDP in micro-rho (g^2 per group), and per-document
  composition (the largest spend over a user's document ids).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from fractions import Fraction

from sentdp.errors import InputError

MICRO = 10**6
"""Ledger units per epsilon."""

MAX_LEDGER_VALUE = 2**62
"""Every product the ledger computes stays below this (SQLite and PostgreSQL use int64)."""


def charge_for(epsilon: float) -> int:
    """Micro-epsilon charged for one document at ``epsilon`` (rounded up; never under)."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise InputError(f"epsilon must be a number, got {type(epsilon).__name__}")
    value = float(epsilon)
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"epsilon must be a finite number above 0, got {epsilon!r}")
    micro = (Decimal(repr(value)) * MICRO).to_integral_value(rounding=ROUND_CEILING)
    if micro >= MAX_LEDGER_VALUE:
        raise InputError(f"epsilon {epsilon!r} is too large to account for")
    return int(micro)


def epsilon_of_charge(micro: int) -> float:
    """The largest float not above ``micro / 10**6``: the epsilon the mechanism runs at."""
    if micro <= 0:
        raise InputError(f"a charge must be positive, got {micro}")
    value = micro / MICRO  # int / int is correctly rounded
    if Fraction(value) > Fraction(micro, MICRO):
        value = math.nextafter(value, 0.0)
    return value


def budget_micro(budget: float) -> int:
    """A budget in group-epsilon, in micro-epsilon rounded down."""
    if not math.isfinite(budget) or budget < 0:
        raise InputError(f"a budget must be a finite number >= 0, got {budget!r}")
    return int((Decimal(repr(float(budget))) * MICRO).to_integral_value(rounding=ROUND_FLOOR))


@dataclass(frozen=True)
class Charge:
    """What one request spends: ``documents`` documents of one mechanism at ``micro``
    micro-epsilon each; under per-document composition, the caller's id of each document."""

    mechanism: str
    micro: int
    documents: int
    document_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.micro <= 0 or self.documents <= 0:
            raise InputError(f"a charge needs positive amounts, got {self}")
        if self.document_ids and len(self.document_ids) != self.documents:
            raise InputError("a charge needs one document id per document, or none")

    @property
    def total_micro(self) -> int:
        return self.micro * self.documents


def rho_of_charge(micro_epsilon: int) -> int:
    """Micro-rho of one release charged ``micro_epsilon`` micro-epsilon: an epsilon-bounded-
    range release is epsilon^2/8-zCDP (see :mod:`sentdp.zcdp`), rounded UP."""
    if micro_epsilon <= 0:
        raise InputError(f"a charge must be positive, got {micro_epsilon}")
    return -(-(micro_epsilon * micro_epsilon) // (8 * MICRO))


PURE, ZCDP = "pure", "zcdp"
SEQUENTIAL, PER_DOCUMENT = "sequential", "per-document"


@dataclass(frozen=True)
class Policy:
    """A tenant's accountant for each user and period.

    ``accounting``: ``pure`` spends micro-epsilon (group factor g); ``zcdp`` spends micro-rho
    (group factor g^2) against a rho budget from (B, delta). ``composition``: ``sequential``
    adds every release; ``per-document`` adds releases of the same document id and takes the
    largest sum over ids (distinct documents are disjoint data). ``limit_micro`` is the limit
    in the accountant's units; ``period_seconds`` renews budgets on a clock aligned to the
    Unix epoch (None: only by the operator's new-period).
    """

    group_size: int
    limit_micro: int
    accounting: str = PURE
    composition: str = SEQUENTIAL
    period_seconds: int | None = None
    budget: float | None = None
    """The tenant's B in epsilon, for reports (the rho limit of zCDP is derived from it)."""

    def __post_init__(self) -> None:
        if self.group_size <= 0 or self.limit_micro < 0:
            raise InputError(f"a policy needs g >= 1 and a budget >= 0, got {self}")
        if self.accounting not in (PURE, ZCDP) or self.composition not in (
            SEQUENTIAL,
            PER_DOCUMENT,
        ):
            raise InputError(f"unknown accountant {self.accounting}/{self.composition}")
        if self.period_seconds is not None and self.period_seconds <= 0:
            raise InputError("a renewal period must be positive")

    @property
    def name(self) -> str:
        """``<accounting>-<composition>``: what the ledger records an account was kept by."""
        return f"{self.accounting}-{self.composition}"

    @property
    def multiplier(self) -> int:
        """What protecting g segments together multiplies the spend by: g, or g^2 for rho."""
        return self.group_size if self.accounting == PURE else self.group_size**2

    def units(self, micro_epsilon: int) -> int:
        """The spend of one release charged ``micro_epsilon``, in this accountant's units."""
        return micro_epsilon if self.accounting == PURE else rho_of_charge(micro_epsilon)

    def admits(self, spent_units: int, added_units: int) -> bool:
        """The admission rule ``multiplier * (spent + added) <= limit`` (the ledger runs it as
        SQL, :data:`ADMISSION_SQL`; tests check the two agree at the boundaries)."""
        return self.multiplier * (spent_units + added_units) <= self.limit_micro

    def remaining_units(self, spent_units: int) -> int:
        """Units left: ``limit - multiplier * spent`` (negative after a lowered budget)."""
        return self.limit_micro - self.multiplier * spent_units

    def window(self, now: float) -> int | None:
        """The automatic period ``now`` falls in (None without automatic renewal)."""
        return None if self.period_seconds is None else int(now // self.period_seconds)

    def window_end(self, now: float) -> int | None:
        """When the window ``now`` falls in ends (Unix seconds; None without renewal)."""
        window = self.window(now)
        return (
            None
            if window is None or self.period_seconds is None
            else ((window + 1) * self.period_seconds)
        )


ADMISSION_SQL = ":g * (spend_units + :total) <= :lim"
""":meth:`Policy.admits` as the ledger's SQL condition on an account (``:g`` the multiplier,
``:total`` the units added, ``:lim`` the limit); both sides are int64 on SQLite and
PostgreSQL. Per document, the same rule runs on the document's row."""


def to_epsilon(micro: int) -> float:
    """Micro-epsilon back to epsilon, for reports (exact up to float rounding)."""
    return micro / MICRO
