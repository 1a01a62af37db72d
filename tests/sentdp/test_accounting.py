"""The one function that turns a requested epsilon into a charge, tested at its edges."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import pytest

from sentdp.accounting import (
    MICRO,
    Charge,
    Policy,
    budget_micro,
    charge_for,
    epsilon_of_charge,
)
from sentdp.errors import InputError


@pytest.mark.parametrize(
    ("epsilon", "micro"),
    [
        (0.1, 100_000),
        (1.0, 1_000_000),
        (1, 1_000_000),
        (2.5, 2_500_000),
        (1e-6, 1),
        (1e-7, 1),
        (0.3, 300_000),
        (1000.0, 1_000_000_000),
        (0.0000015, 2),
        (1.0000001, 1_000_001),
    ],
)
def test_charges_are_the_decimal_epsilon_in_micro_units_rounded_up(
    epsilon: float, micro: int
) -> None:
    assert charge_for(epsilon) == micro


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.nan, math.inf, -math.inf, sys.float_info.max])
def test_impossible_epsilons_are_refused(epsilon: float) -> None:
    with pytest.raises(InputError, match="epsilon"):
        charge_for(epsilon)


def test_non_numbers_are_refused() -> None:
    with pytest.raises(InputError, match="must be a number"):
        charge_for("1")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="must be a number"):
        charge_for(True)


@pytest.mark.parametrize("micro", [1, 3, 100_000, 300_000, 1_000_001, 123_456_789, 10**15 + 1])
def test_the_mechanism_never_runs_above_the_charge(micro: int) -> None:
    epsilon = epsilon_of_charge(micro)
    assert Fraction(epsilon) <= Fraction(micro, MICRO)
    assert Fraction(math.nextafter(epsilon, math.inf)) > Fraction(micro, MICRO)  # the largest


def test_admission_at_the_exact_remainder_and_one_micro_over() -> None:
    limit = budget_micro(10.0)
    assert limit == 10 * MICRO
    policy = Policy(group_size=2, limit_micro=limit)
    assert policy.admits(3 * MICRO, 2 * MICRO)  # 2 * (3 + 2) == 10: exactly the limit
    assert not policy.admits(3 * MICRO, 2 * MICRO + 1)  # one micro-epsilon over
    assert policy.remaining_units(3 * MICRO) == 4 * MICRO


def test_zcdp_policies_spend_rho_with_a_squared_group_factor() -> None:
    policy = Policy(group_size=3, limit_micro=10 * MICRO, accounting="zcdp")
    assert policy.multiplier == 9
    assert policy.units(2 * MICRO) == MICRO // 2  # rho = 2^2 / 8
    assert policy.units(1) == 1  # rounded up, never zero
    assert policy.name == "zcdp-sequential"
    assert Policy(1, 1, period_seconds=86_400).window(86_400 * 5 + 3) == 5
    with pytest.raises(InputError):
        Policy(1, 1, accounting="renyi")
    with pytest.raises(InputError, match="one document id per document"):
        Charge("deepcandidate", 1, 2, ("a",))


def test_budgets_round_down_and_charges_validate() -> None:
    assert budget_micro(0.0000019) == 1
    with pytest.raises(InputError):
        budget_micro(math.inf)
    with pytest.raises(InputError, match="positive"):
        Charge("deepcandidate", 0, 1)
    with pytest.raises(InputError, match="policy"):
        Policy(group_size=0, limit_micro=1)
    assert Charge("deepcandidate", 5, 3).total_micro == 15
