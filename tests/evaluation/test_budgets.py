"""The README's documents-per-user table counts whole releases under each accountant."""

from __future__ import annotations

from evaluation.budgets import documents, table
from sentdp.accounting import charge_for
from sentdp.zcdp import rho_budget_micro, rho_of_charge


def test_the_budget_table_counts_whole_releases() -> None:
    assert documents(100.0, 1.0)[0] == 100
    assert documents(10.0, 3.0)[0] == 3
    pure, zcdp, per_id = documents(100.0, 1.0)
    assert per_id == pure
    assert zcdp == rho_budget_micro(100.0, 1e-6) // rho_of_charge(charge_for(1.0))
    assert documents(10.0, 6.0)[1] == 0  # one release at 6 already exceeds (10, 1e-6) as zCDP


def test_the_table_has_a_row_per_budget_and_epsilon() -> None:
    assert table().count("\n") == 2 + 2 * 4
