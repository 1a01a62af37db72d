"""How a reservation debits, and a refund credits, a user's spend under each accountant.

Statements for :class:`~service.ledger.sql.SqlLedger`, run inside its transactions:

* ``sequential``: one conditional UPDATE of the account (:data:`ADMISSION_SQL`).
* ``per-document``: one conditional upsert per distinct document id of the request (the same
  rule on the document's row: repeated ids inside a request add up first), then the account's
  spend becomes the largest document spend. A refused id aborts the whole transaction, so no
  document of a refused request is debited.
* A refund credits what its charge row debited (its units, its document, its period) and, per
  document, recomputes the account's largest spend.
* A tenant renewing budgets on a clock starts a new period for the user at the first request
  after the current period's end (the end of the window it opened in, under the period length
  of that time), inside the same transaction as the debit. A change of ``period_days`` so
  never renews anyone early.
* A replica from before schema 3 debits ``spent_micro`` alone (it knows pure sequential
  epsilon only). Before admitting, an account kept in pure sequential epsilon, or by no
  accountant yet, takes ``spend_units`` up to ``spent_micro``, and is then kept in pure
  sequential epsilon: an older replica's debits are never invisible to a newer one (a tenant
  on another accountant then gets 409 ``accountant_changed`` until a new period opens).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sentdp.accounting import ADMISSION_SQL, PER_DOCUMENT, PURE, SEQUENTIAL, Charge, Policy
from sentdp.errors import InputError
from service.ledger.types import Account, AccountantChangedError

if TYPE_CHECKING:
    from service.ledger.sql import SqlLedger

_ACCOUNT = (
    "SELECT spent_micro, documents, period, spend_units, accountant, period_window, "
    "period_ends FROM sentdp_accounts WHERE tenant = :t AND user_id = :u"
)
_PURE_SEQUENTIAL = f"{PURE}-{SEQUENTIAL}"
_CATCH_UP = (
    # Only pure sequential units are spent_micro's: a per-document account's spent_micro (its
    # documents' sum) is legitimately above its largest document's spend. No accountant with
    # a spend, or no spend_units at all, is an account only a replica from before schema 3
    # has written to (with no spend_units, every debit's admission would be NULL: refused).
    "UPDATE sentdp_accounts SET "
    "accountant = CASE WHEN spent_micro > 0 THEN :acc ELSE accountant END, "
    "spend_units = CASE WHEN spent_micro > COALESCE(spend_units, 0) THEN spent_micro "
    "ELSE COALESCE(spend_units, 0) END "
    "WHERE tenant = :t AND user_id = :u AND ("
    "(accountant IS NULL AND (spent_micro > 0 OR spend_units IS NULL)) "
    "OR (accountant = :acc AND spent_micro > COALESCE(spend_units, 0)))"
)
_OPEN_WINDOW = (
    "UPDATE sentdp_accounts SET period_window = :w, period_ends = :e, "
    "spent_micro = CASE WHEN :r = 1 THEN 0 ELSE spent_micro END, "
    "documents = CASE WHEN :r = 1 THEN 0 ELSE documents END, "
    "spend_units = CASE WHEN :r = 1 THEN 0 ELSE spend_units END, "
    "accountant = CASE WHEN :r = 1 THEN NULL ELSE accountant END, "
    "period = period + :r WHERE tenant = :t AND user_id = :u "
    # Re-checked on the newest row: a concurrent request that renewed first (this sentdp, or
    # an older one, which writes period_window alone) wins alone.
    "AND (period_ends IS NULL OR period_ends <= :now) AND "
)
_DEBIT_SEQUENTIAL = (
    "UPDATE sentdp_accounts SET spent_micro = spent_micro + :eps, "  # noqa: S608 (constants)
    "documents = documents + :n, spend_units = spend_units + :total, accountant = :acc "
    f"WHERE tenant = :t AND user_id = :u AND {ADMISSION_SQL} "
    "RETURNING spent_micro, documents, period, spend_units, accountant"
)
_DEBIT_DOCUMENT = (
    "INSERT INTO sentdp_documents (tenant, user_id, period, document_id, spend_units) "
    "VALUES (:t, :u, :p, :d, :total) ON CONFLICT (tenant, user_id, period, document_id) "
    "DO UPDATE SET spend_units = sentdp_documents.spend_units + excluded.spend_units "
    "WHERE :g * (sentdp_documents.spend_units + excluded.spend_units) <= :lim "
    "RETURNING spend_units"
)
_DEBIT_LARGEST = (
    "UPDATE sentdp_accounts SET spent_micro = spent_micro + :eps, "
    "documents = documents + :n, accountant = :acc, "
    "spend_units = CASE WHEN spend_units < :m THEN :m ELSE spend_units END "
    "WHERE tenant = :t AND user_id = :u "
    "RETURNING spent_micro, documents, period, spend_units, accountant"
)


@dataclass(frozen=True)
class Clock:
    """Where an account stands on its tenant's renewal clock."""

    window: int | None
    """The window its period opened in (its index under the period length of that time)."""
    ends: int | None
    """When its period ends (Unix seconds); None for a period opened before schema 4."""

    def due(self, policy: Policy, now: float) -> bool:
        """Whether the next request under ``policy`` at ``now`` opens a new period: the
        current one has ended, and no request (of any sentdp version) has opened one in the
        window ``now`` falls in. A period from before ``period_ends`` was kept ends with its
        window under today's length."""
        current = policy.window(now)
        if current is None or self.window is None or self.window == current:
            return False
        return self.ends is None or now >= self.ends


def read_account(ledger: SqlLedger, cur: Any, tenant: str, user: str) -> Account:
    return _read(ledger, cur, tenant, user)[0]


def view_account(
    ledger: SqlLedger, cur: Any, tenant: str, user: str, policy: Policy, now: float
) -> Account:
    """The account as the next request at ``now`` will find it (a period that has ended
    shows as the next, empty one), without writing anything."""
    account, clock = _read(ledger, cur, tenant, user)
    if clock.due(policy, now):
        return Account(tenant, user, 0, 0, account.period + 1)
    return account


def _read(
    ledger: SqlLedger, cur: Any, tenant: str, user: str, lock: bool = False
) -> tuple[Account, Clock]:
    sql = _ACCOUNT + (ledger._lock_clause() if lock else "")
    row = ledger._execute(cur, sql, {"t": tenant, "u": user}).fetchone()
    if row is None:
        return Account(tenant, user, 0, 0, 0), Clock(None, None)
    spent, documents, period, units, accountant, window, ends = row
    behind = spent > (units or 0)
    if (accountant is None and spent > 0) or (accountant == _PURE_SEQUENTIAL and behind):
        units, accountant = max(spent, units or 0), _PURE_SEQUENTIAL  # as _CATCH_UP leaves it
    account = Account(
        tenant, user, int(spent), int(documents), int(period), int(units or 0), accountant
    )
    return account, Clock(
        None if window is None else int(window), None if ends is None else int(ends)
    )


def prepare(
    ledger: SqlLedger, cur: Any, tenant: str, user: str, policy: Policy, now: float
) -> Account:
    """The user's account, renewed if its window has passed, checked against the accountant."""
    ledger._execute(
        cur,
        "INSERT INTO sentdp_accounts (tenant, user_id, spend_units) VALUES (:t, :u, 0) "
        "ON CONFLICT (tenant, user_id) DO NOTHING",
        {"t": tenant, "u": user},
    )
    # Locked until commit (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises): a
    # request that renews the period meanwhile would otherwise commit between this read and
    # the debit, which would then go to the old period's document rows and the new period's
    # charge rows, and a refund of it would credit the new period.
    account, clock = _read(ledger, cur, tenant, user, lock=True)
    # After the lock: run before it, an older replica's uncommitted debit would leave this
    # conditional UPDATE's snapshot unmatched, and the debit below would admit past B.
    ledger._execute(cur, _CATCH_UP, {"t": tenant, "u": user, "acc": _PURE_SEQUENTIAL})
    current, end = policy.window(now), policy.window_end(now)
    if current is not None and (clock.ends is None or clock.ends <= now):
        params = {"w": current, "e": end, "t": tenant, "u": user, "now": int(now)}
        if clock.window is None or clock.due(policy, now):
            # The first window starts where the account stands; a later one renews it.
            renew = clock.window is not None
            guard = "(period_window IS NULL OR period_window <> :w)"
            ledger._execute(cur, _OPEN_WINDOW + guard, params | {"r": int(renew)})
        elif clock.window == current:
            # Opened in this window without an end (before schema 4, or by an older
            # sentdp): record the end, renew nothing.
            ledger._execute(cur, _OPEN_WINDOW + "period_window = :w", params | {"r": 0})
        account = read_account(ledger, cur, tenant, user)
    kept_by = account.kept_by_another(policy.name)
    if kept_by is not None:
        raise AccountantChangedError(kept_by, policy.name)
    return account


def debit(
    ledger: SqlLedger, cur: Any, account: Account, charge: Charge, policy: Policy
) -> Account | None:
    """Debit ``charge`` under ``policy``: the account after it, or None if refused."""
    if bool(charge.document_ids) != (policy.composition == PER_DOCUMENT):
        raise InputError(  # a per-document debit without ids would charge no document
            f"a {policy.composition} accountant needs "
            f"{'one document id per document' if charge.document_ids == () else 'no document ids'}"
        )
    units = policy.units(charge.micro)
    params = {
        "t": account.tenant,
        "u": account.user,
        "eps": charge.total_micro,
        "n": charge.documents,
        "acc": policy.name,
        "g": policy.multiplier,
        "lim": policy.limit_micro,
    }
    if policy.composition == SEQUENTIAL:
        row = ledger._execute(
            cur, _DEBIT_SEQUENTIAL, params | {"total": units * charge.documents}
        ).fetchone()
    else:
        largest = 0
        for document_id, count in sorted(Counter(charge.document_ids).items()):
            total = units * count
            if not policy.admits(0, total):
                return None
            stored = ledger._execute(
                cur,
                _DEBIT_DOCUMENT,
                params | {"p": account.period, "d": document_id, "total": total},
            ).fetchone()
            if stored is None:
                return None
            largest = max(largest, int(stored[0]))
        row = ledger._execute(cur, _DEBIT_LARGEST, params | {"m": largest}).fetchone()
    if row is None:
        return None
    spent, documents, period, spend, accountant = row
    return Account(
        account.tenant,
        account.user,
        int(spent),
        int(documents),
        int(period),
        int(spend),
        accountant,
    )


def credit(
    ledger: SqlLedger, cur: Any, tenant: str, user: str, charge_row: tuple[Any, ...]
) -> None:
    """Give back what one refunded charge row debited (micro, units, period, document id)."""
    micro, units, period, document_id = charge_row
    params = {
        "t": tenant,
        "u": user,
        "m": int(micro),
        "units": int(units if units is not None else micro),
        "p": int(period),
        "d": document_id,
    }
    if document_id is None:
        ledger._execute(
            cur,
            "UPDATE sentdp_accounts SET spent_micro = spent_micro - :m, "
            "documents = documents - 1, spend_units = spend_units - :units "
            "WHERE tenant = :t AND user_id = :u AND period = :p",
            params,
        )
        return
    ledger._execute(
        cur,
        "UPDATE sentdp_documents SET spend_units = spend_units - :units "
        "WHERE tenant = :t AND user_id = :u AND period = :p AND document_id = :d",
        params,
    )
    ledger._execute(
        cur,
        "UPDATE sentdp_accounts SET spent_micro = spent_micro - :m, documents = documents - 1, "
        "spend_units = COALESCE((SELECT MAX(spend_units) FROM sentdp_documents "
        "WHERE tenant = :t AND user_id = :u AND period = :p), 0) "
        "WHERE tenant = :t AND user_id = :u AND period = :p",
        params,
    )
