"""How many documents a user gets per period under each accountant, for a README table.

``python -m evaluation.budgets [--out reports/budgets.md]``: at budgets B in {10, 100} and
epsilon in {1, 3, 6, 10} per document, with group size g = 1, the number of documents one user
may have privatized per period

* sequentially, pure epsilon: ``floor(B / epsilon)`` in integer micro-epsilon;
* sequentially, zCDP at delta = 1e-6: ``floor(rho_max(B, delta) / rho(epsilon))`` in micro-rho,
  with rho = epsilon^2/8 rounded up and rho_max rounded down (:mod:`sentdp.zcdp`);
* per document (parallel composition over distinct document ids): any number of distinct
  documents, each privatized (re-sent or edited) ``floor(B / epsilon)`` times.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sentdp.accounting import budget_micro, charge_for
from sentdp.zcdp import rho_budget_micro, rho_of_charge

BUDGETS = (10.0, 100.0)
EPSILONS = (1.0, 3.0, 6.0, 10.0)
DELTA = 1e-6


def documents(budget: float, epsilon: float) -> tuple[int, int, int]:
    """(pure sequential, zCDP sequential, per-document releases of one id)."""
    micro = charge_for(epsilon)
    pure = budget_micro(budget) // micro
    zcdp = rho_budget_micro(budget, DELTA) // rho_of_charge(micro)
    return pure, zcdp, pure


def table() -> str:
    lines = [
        "| B | epsilon | sequential, pure | sequential, zCDP (delta = 1e-6) | per document |",
        "|---|---|---|---|---|",
    ]
    for budget in BUDGETS:
        for epsilon in EPSILONS:
            pure, zcdp, per_id = documents(budget, epsilon)
            lines.append(
                f"| {budget:g} | {epsilon:g} | {pure} | {zcdp} "
                f"| unlimited documents, {per_id} releases of each |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    text = table()
    print(text)
    if args.out:
        args.out.write_text(
            "# Documents per user per period\n\n`python -m evaluation.budgets` (g = 1)\n\n" + text
        )


if __name__ == "__main__":
    main()
