"""zCDP accounting: ε²/8 per release rounded up, and rho_max never above what (B, δ) allows."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from sentdp.accounting import MICRO, charge_for
from sentdp.zcdp import bun_steinke_epsilon, epsilon_of_rho, rho_budget_micro, rho_of_charge


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 2.5, 3.0, 6.0, 10.0, 1e-6])
def test_a_release_costs_epsilon_squared_over_8_rounded_up(epsilon: float) -> None:
    micro = charge_for(epsilon)
    rho = rho_of_charge(micro)
    exact = Fraction(micro, MICRO) ** 2 / 8
    assert Fraction(rho, MICRO) >= exact
    assert Fraction(rho - 1, MICRO) < exact  # the smallest such integer


@pytest.mark.parametrize("budget", [1.0, 3.0, 10.0, 100.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-6, 1e-9])
def test_the_rho_budget_is_the_largest_that_keeps_epsilon_within_the_budget(
    budget: float, delta: float
) -> None:
    rho_max = rho_budget_micro(budget, delta)
    assert epsilon_of_rho(rho_max / MICRO, delta) <= budget
    assert epsilon_of_rho((rho_max + 1) / MICRO, delta) > budget
    # the RDP conversion is tighter than Bun and Steinke's: more rho for the same guarantee
    assert bun_steinke_epsilon(rho_max / MICRO, delta) >= budget


def test_the_conversion_is_dp_accountings() -> None:
    from dp_accounting.rdp import rdp_privacy_accountant

    orders = [1.5, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0]
    expected, _ = rdp_privacy_accountant.compute_epsilon(orders, [0.5 * a for a in orders], 1e-6)
    ours = epsilon_of_rho(0.5, 1e-6)
    assert ours <= expected + 1e-12  # a finer grid of orders is never looser
    assert ours >= 0.9 * expected


def test_zcdp_pays_off_for_many_small_releases_not_for_a_few_large_ones() -> None:
    rho_max = rho_budget_micro(100.0, 1e-6)
    small, large = charge_for(1.0), charge_for(6.0)
    assert rho_max // rho_of_charge(small) > 3 * (100 * MICRO // small)  # 100 pure releases
    assert rho_max // rho_of_charge(large) < 100 * MICRO // large  # 16 pure releases
    assert math.isfinite(epsilon_of_rho(1.0, 1e-6))
