"""(ε, δ) accounting through zero-concentrated DP, in integer micro-rho like the ledger.

* The exponential mechanism, with its data-independent uniform floor, has range bounded by ε,
  so one release at ε is ε²/8-zCDP (Cesar and Rogers, "Bounding, Concentrating, and
  Truncating: Unifying Privacy Loss Composition for Data Analytics", ALT 2021). A group of g
  segments multiplies rho by g². zCDP composes by adding rho, also for adaptively chosen ε when
  admission stops at a fixed rho_max (a zCDP filter).
* A release charged ``micro`` micro-ε costs ``ceil(micro² / (8·10⁶))`` micro-rho: computed from
  the charged ε (never below the ε the mechanism runs at) and rounded UP.
* rho_max for a tenant's (B, δ) is the largest micro-rho whose (ε, δ) guarantee, by the RDP
  conversion of Google's ``dp_accounting`` (rho-zCDP is (alpha, rho*alpha)-RDP for every
  alpha > 1), is at most B: found by bisection on integers and so rounded DOWN. Bun and
  Steinke's closed form ``rho + 2·sqrt(rho·ln(1/δ))`` is looser; tests check both.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from sentdp.accounting import MICRO, rho_of_charge
from sentdp.errors import InputError

__all__ = ["bun_steinke_epsilon", "epsilon_of_rho", "rho_budget_micro", "rho_of_charge"]

RDP_ORDERS = np.concatenate([np.linspace(1.01, 10.0, 300), np.arange(11.0, 2001.0)])
"""Rényi orders of the zCDP → (ε, δ) conversion."""


def epsilon_of_rho(rho: float, delta: float) -> float:
    """The ε of rho-zCDP at δ, by dp_accounting's RDP conversion."""
    from dp_accounting.rdp import rdp_privacy_accountant

    if rho <= 0:
        return 0.0
    epsilon, _ = rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, rho * RDP_ORDERS, delta)
    return float(epsilon)


@functools.cache
def rho_budget_micro(budget: float, delta: float) -> int:
    """The largest micro-rho whose (ε, δ) guarantee is within ``budget`` at ``delta``."""
    if not math.isfinite(budget) or budget < 0:
        raise InputError(f"a budget must be a finite number >= 0, got {budget!r}")
    if not 0 < delta < 1:
        raise InputError(f"delta must be in (0, 1), got {delta!r}")
    low, high = 0, max(1, int(budget * budget * MICRO) + 1)  # rho <= B² covers every B
    while epsilon_of_rho(high / MICRO, delta) <= budget:
        high *= 2
    while high - low > 1:
        middle = (low + high) // 2
        if epsilon_of_rho(middle / MICRO, delta) <= budget:
            low = middle
        else:
            high = middle
    return low


def bun_steinke_epsilon(rho: float, delta: float) -> float:
    """Bun and Steinke's closed-form (ε, δ) bound of rho-zCDP (a looser check)."""
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
