"""What the ledger stores and answers: accounts, reservations, replays, and its refusals.

Plain values with no storage code, so the charging flow and its tests can use them without a
database driver.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from sentdp.accounting import Charge, Policy

IDEMPOTENCY_TTL_SECONDS = 24 * 3600
"""How long a completed request's stored response answers retries with the same key."""


@dataclass(frozen=True)
class Account:
    """A user's spending in the current period: the sum of epsilons (micro-epsilon), and the
    spend as the tenant's accountant defines it (``spend_units``, in its units)."""

    tenant: str
    user: str
    spent_micro: int
    documents: int
    period: int
    spend_units: int = 0
    accountant: str | None = None

    def kept_by_another(self, accountant: str) -> str | None:
        """The accountant that kept this period's spend, if it is not ``accountant`` (the
        tenant's now): the spend is then in that accountant's units, and requests get 409
        until a new period opens."""
        if self.accountant in (None, accountant) or self.spend_units <= 0:
            return None
        return self.accountant


@dataclass(frozen=True)
class IdempotencyKey:
    """A client's retry key for one logical request, with HMACs of the request body: under
    the current secret (stored) and under secrets being rotated out (accepted)."""

    key: str
    body_hmac: str
    previous_hmacs: tuple[str, ...] = ()

    def matches(self, stored: str) -> bool:
        """Whether a stored body HMAC is this request's body (under any known secret)."""
        found = False
        for candidate in (self.body_hmac, *self.previous_hmacs):
            found |= hmac.compare_digest(candidate, stored)
        return found


@dataclass(frozen=True)
class Reservation:
    """A successful debit: one charge row per document, and the account after it."""

    charge_ids: list[int]
    account: Account


@dataclass(frozen=True)
class Replay:
    """A completed request with the same idempotency key: return its stored response."""

    response: str
    status: int = 200


class LedgerError(Exception):
    """Base of the ledger's refusals."""


class BudgetExhaustedError(LedgerError):
    def __init__(self, account: Account, charge: Charge, policy: Policy) -> None:
        super().__init__("privacy budget exhausted")
        self.account = account
        self.charge = charge
        self.policy = policy


class AccountantChangedError(LedgerError):
    """The user's current period was kept by another accountant (the tenant changed it)."""

    def __init__(self, kept_by: str, wanted: str) -> None:
        super().__init__(f"this period was accounted {kept_by}, the tenant now uses {wanted}")
        self.kept_by = kept_by
        self.wanted = wanted


class IdempotencyInFlightError(LedgerError):
    """Another request with the same key has not finished."""


class IdempotencyMismatchError(LedgerError):
    """The key was used before with a different request body."""


@dataclass(frozen=True)
class StoredReplies:
    """A bound on the bytes of one tenant's stored replies (one tenant must not fill the
    ledger's disk for all), and what is stored instead of a reply that would pass it."""

    limit: int
    instead: str
    """A short reply to store in its place (the key stays done, so a retry never pays twice)."""
    instead_status: int

    def reply(self, stored: int, response: str, status: int) -> tuple[str, int]:
        """``(response, status)`` if it fits beside ``stored`` bytes, else the stand-in."""
        if stored + len(response.encode()) <= self.limit:
            return response, status
        return self.instead, self.instead_status
