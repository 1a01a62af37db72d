"""Housekeeping over real HTTP: a gateway purges expired idempotency rows (stored replies,
with their embeddings and user ids) although no charged request comes to trigger it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentdp.accounting import MICRO, Charge, Policy
from service.ledger import IDEMPOTENCY_TTL_SECONDS, IdempotencyKey, Reservation, open_ledger
from tests.support import Server, age_pending_keys, wait_for, write_tenants

pytestmark = pytest.mark.server


def stored_keys(url: str) -> list[str]:
    ledger = open_ledger(url)
    try:
        with ledger.transaction() as cur:
            rows = ledger._execute(cur, "SELECT key FROM sentdp_idempotency").fetchall()
    finally:
        ledger.close()
    return sorted(str(row[0]) for row in rows)


def test_a_server_with_no_traffic_purges_replies_past_their_window(
    quick_bundle_tag: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    ledger = open_ledger(url)
    for name in ("expired", "fresh"):
        key = IdempotencyKey(name, "h")
        reserved = ledger.reserve(
            "acme", "alice", Charge("deepcandidate", MICRO, 1), Policy(1, 10 * MICRO), "r", key
        )
        assert isinstance(reserved, Reservation)
        ledger.settle("acme", "alice", reserved.charge_ids, [], key, '{"k": 1}')
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 60, key="expired")
    ledger.close()
    assert stored_keys(url) == ["expired", "fresh"]
    env = {
        "SENTDP_MODEL": quick_bundle_tag,
        "SENTDP_TENANTS_FILE": str(write_tenants(tmp_path / "tenants.json")),
        "SENTDP_LEDGER_URL": url,
    }
    server = Server(env, log=tmp_path / "server.log").start()
    try:  # only /readyz was asked: no reservation could have purged it
        wait_for(lambda: stored_keys(url) == ["fresh"], timeout=30)
    finally:
        server.stop()
    reopened = open_ledger(url)
    assert reopened.account("acme", "alice").spent_micro == 2 * MICRO  # charges are kept
    reopened.close()
