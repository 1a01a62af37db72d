"""200 concurrent charged requests for one user whose budget admits exactly 50, on a server
with two gateway workers, against SQLite and against a real PostgreSQL server."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest

from service.ledger import open_ledger
from tests.support import TENANTS, Server, write_tenants

pytestmark = [pytest.mark.server, pytest.mark.slow]

TINY = TENANTS[2]  # max epsilon 1, budget 50


@pytest.fixture
def ledger_server(ledger_url: tuple[str, str], quick_bundle_tag: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A server on a fresh ledger of each backend (``ledger_url`` is parametrised)."""
    url, schema = ledger_url
    env = {
        "SENTDP_MODEL": quick_bundle_tag,
        "SENTDP_TENANTS_FILE": str(write_tenants(tmp_path / "tenants.json")),
        "SENTDP_LEDGER_URL": url,
        "SENTDP_LEDGER_SCHEMA": schema,
        # all 200 at once reach the ledger: the race under test, not the admission cap
        "SENTDP_TENANT_INFLIGHT_REQUESTS": "200",
    }
    server = Server(env, log=tmp_path / "server.log").start()
    yield server, url, schema
    server.stop()


async def fire(server: Server, count: int) -> list[int]:
    limits = httpx.Limits(max_connections=count)
    headers = {"Authorization": f"Bearer {TINY.key}"}
    async with httpx.AsyncClient(
        base_url=server.url, headers=headers, limits=limits, timeout=300
    ) as http:

        async def one(i: int) -> int:
            body = {
                "user": "crowd",
                "epsilon": 1.0,
                "documents": [{"text": f"Request number {i} arrives. It has two sentences."}],
            }
            return (await http.post("/privatize", json=body)).status_code

        return list(await asyncio.gather(*(one(i) for i in range(count))))


def test_exactly_the_budget_is_spent_under_200_concurrent_requests(ledger_server) -> None:
    server, url, schema = ledger_server
    statuses = Counter(asyncio.run(fire(server, 200)))
    assert statuses == {200: 50, 402: 150}, statuses
    ledger = open_ledger(url, schema)
    account = ledger.account("tiny", "crowd")
    assert account.spent_micro == 50 * 1_000_000
    assert account.documents == 50
    charges = [c for c in ledger.charges("tiny") if c["user"] == "crowd"]
    assert len(charges) == 50
    assert {c["state"] for c in charges} == {"final"}
    ledger.close()
