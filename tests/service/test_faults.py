"""The ledger under faults: kill -9 in the middle of charged load, and two servers sharing one
ledger (PostgreSQL, or one SQLite file). Success always implies a recorded charge; nothing
sampled is refunded; no user ever exceeds the limit."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from service.ledger import open_ledger
from tests.support import Server, TenantSpec, read_journal, write_tenants

pytestmark = [pytest.mark.server, pytest.mark.slow]

FAULT = TenantSpec("fault", "sdp_test_fault_key_0123456789abcdef", 1.0, 2, 10.0)  # 5 charges/user


def start(quick_bundle_tag: str, url: str, schema: str, folder: Path, name: str) -> Server:
    env = {
        "SENTDP_MODEL": quick_bundle_tag,
        "SENTDP_TENANTS_FILE": str(write_tenants(folder / "tenants.json", (FAULT,))),
        "SENTDP_LEDGER_URL": url,
        "SENTDP_LEDGER_SCHEMA": schema,
        "SENTDP_SAMPLE_JOURNAL": str(folder / "journal.txt"),
    }
    return Server(env, log=folder / f"{name}.log").start()


HEAVY = ("heavy-0", "heavy-1", "heavy-2")


def hammer(server: Server, thread: int, stop: threading.Event, outcomes: Counter) -> None:
    """Charged requests until the server dies: heavy users (who exhaust their budget) and fresh
    ones (whose requests are in flight when the server is killed)."""
    headers = {"Authorization": f"Bearer {FAULT.key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
        n = 0
        while not stop.is_set():
            user = HEAVY[n // 2 % 3] if n % 2 == 0 else f"fresh-{thread}-{n}"
            body = {"user": user, "epsilon": 1.0, "documents": [{"text": f"Load {n}. Is here."}]}
            try:
                status = http.post("/privatize", json=body).status_code
            except httpx.HTTPError:
                outcomes[(user, "lost")] += 1
                return
            outcomes[(user, status)] += 1
            n += 1


def check_ledger(url: str, schema: str, journal: Path, successes: Counter) -> None:
    ledger = open_ledger(url, schema)
    charges = ledger.charges("fault")
    sampled = read_journal(journal)
    refunded = {c["id"] for c in charges if c["state"] == "refunded"}
    assert not refunded & sampled, "a charge was refunded after its mechanism ran"
    for account in ledger.accounts():
        if account.tenant != "fault":
            continue
        kept = [c for c in charges if c["user"] == account.user and c["state"] != "refunded"]
        assert account.spent_micro == sum(c["micro"] for c in kept)
        assert FAULT.group_size * account.spent_micro <= 10 * 1_000_000, "over the limit"
        assert account.documents >= successes[account.user], "a success without its charge"
    for user, count in successes.items():
        assert ledger.account("fault", user).documents >= count
    ledger.close()


def test_kill_9_under_load_never_under_charges(
    ledger_url: tuple[str, str], quick_bundle_tag: str, tmp_path: Path
) -> None:
    url, schema = ledger_url
    server = start(quick_bundle_tag, url, schema, tmp_path, "first")
    outcomes: Counter = Counter()
    stop = threading.Event()
    threads = [threading.Thread(target=hammer, args=(server, t, stop, outcomes)) for t in range(4)]
    for thread in threads:
        thread.start()

    def exhausted() -> bool:
        return all(outcomes[(user, 402)] > 0 for user in HEAVY)

    deadline = time.monotonic() + 120
    while not exhausted() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    server.kill()  # kill -9 of every process while charged requests are in flight
    stop.set()
    for thread in threads:
        thread.join(60)
    assert exhausted()
    successes = Counter({u: v for (u, s), v in outcomes.items() if s == 200})
    assert all(successes[user] == 5 for user in HEAVY)  # g * 5 * epsilon = 10 = the budget
    assert sum(v for (_, s), v in outcomes.items() if s == "lost") > 0  # some were in flight
    check_ledger(url, schema, tmp_path / "journal.txt", successes)

    again = start(quick_bundle_tag, url, schema, tmp_path, "second")
    try:
        with httpx.Client(
            base_url=again.url, headers={"Authorization": f"Bearer {FAULT.key}"}, timeout=60
        ) as http:
            fresh = http.post(
                "/privatize",
                json={"user": "after-restart", "epsilon": 1.0, "documents": [{"text": "A. B."}]},
            )
            spent = http.post(
                "/privatize",
                json={"user": HEAVY[0], "epsilon": 1.0, "documents": [{"text": "A. B."}]},
            )
        assert fresh.status_code == 200, fresh.text
        assert spent.status_code == 402  # its budget was spent before the crash
    finally:
        again.stop()
    check_ledger(url, schema, tmp_path / "journal.txt", successes)


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_two_servers_sharing_one_ledger_never_overspend(
    quick_bundle_tag: str, tmp_path: Path, backend: str
) -> None:
    """Two servers (each of two gateway processes) on one ledger: PostgreSQL, the replicas'
    option, and one SQLite file, whose writers queue on its lock file across processes."""
    import os
    import uuid

    from service.ledger.postgres import PostgresLedger

    schema = f"t_{uuid.uuid4().hex[:16]}"
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    else:
        url = os.environ.get("SENTDP_TEST_POSTGRES_URL", "")
        if not url:
            pytest.skip("SENTDP_TEST_POSTGRES_URL is not set (.ci/test sets it)")
    first = start(quick_bundle_tag, url, schema, tmp_path, "a")
    second = start(quick_bundle_tag, url, schema, tmp_path, "b")
    try:

        async def fire() -> list[int]:
            headers = {"Authorization": f"Bearer {FAULT.key}"}
            async with (
                httpx.AsyncClient(base_url=first.url, headers=headers, timeout=300) as a,
                httpx.AsyncClient(base_url=second.url, headers=headers, timeout=300) as b,
            ):

                async def one(i: int) -> int:
                    http = a if i % 2 else b
                    body = {
                        "user": f"shared-{i % 3}",
                        "epsilon": 1.0,
                        "documents": [{"text": f"Request {i}. Two sentences."}],
                    }
                    return (await http.post("/privatize", json=body)).status_code

                return list(await asyncio.gather(*(one(i) for i in range(60))))

        statuses = Counter(asyncio.run(fire()))
        assert statuses == {200: 15, 402: 45}, statuses  # 3 users x 5 charges each
        ledger = open_ledger(url, schema)
        for user in ("shared-0", "shared-1", "shared-2"):
            account = ledger.account("fault", user)
            assert account.spent_micro == 5 * 1_000_000
            assert account.documents == 5
        ledger.close()
    finally:
        first.stop()
        second.stop()
        if backend == "postgres":
            PostgresLedger(url, schema).drop_schema()
