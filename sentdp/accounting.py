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
    micro-epsilon each."""

    mechanism: str
    micro: int
    documents: int

    def __post_init__(self) -> None:
        if self.micro <= 0 or self.documents <= 0:
            raise InputError(f"a charge needs positive amounts, got {self}")

    @property
    def total_micro(self) -> int:
        return self.micro * self.documents


@dataclass(frozen=True)
class Policy:
    """A tenant's rule: groups of ``group_size`` sentences, ``limit_micro`` group-micro-epsilon
    per user and period."""

    group_size: int
    limit_micro: int

    def __post_init__(self) -> None:
        if self.group_size <= 0 or self.limit_micro < 0:
            raise InputError(f"a policy needs g >= 1 and a budget >= 0, got {self}")

    def admits(self, spent_micro: int, charge: Charge) -> bool:
        """The admission rule ``g * (spent + charge) <= limit`` (the ledger runs it as SQL,
        :data:`ADMISSION_SQL`; tests check the two agree at the boundaries)."""
        return self.group_size * (spent_micro + charge.total_micro) <= self.limit_micro

    def remaining_micro(self, spent_micro: int) -> int:
        """Group-micro-epsilon left: ``limit - g * spent`` (negative after a lowered budget)."""
        return self.limit_micro - self.group_size * spent_micro


ADMISSION_SQL = ":g * (spent_micro + :total) <= :lim"
""":meth:`Policy.admits` as the ledger's SQL condition (``:g`` the group size, ``:total`` the
charge's micro-epsilon, ``:lim`` the limit); both sides are int64 on SQLite and PostgreSQL."""


def to_epsilon(micro: int) -> float:
    """Micro-epsilon back to epsilon, for reports (exact up to float rounding)."""
    return micro / MICRO
