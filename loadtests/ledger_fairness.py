"""How long one tenant's request waits for the ledger while another floods it with tiny
requests: the ledger's threads taking tenants in turns, against first come, first served.

Run: ``.venv/bin/python loadtests/ledger_fairness.py [--seconds 20] [--clients 64]
[--ledger-url postgresql://...]``

In process, without HTTP: the real charging flow (``service.charging.Charging``) on a real
ledger (a new SQLite file, or a new schema of ``--ledger-url``'s PostgreSQL database, per
run) and the unit tests' tiny bundle, with a stand-in worker that takes 5 ms
and runs the real mechanism. Tenant A runs ``--clients`` closed-loop clients of one-sentence
requests (64 by default: as many as a tenant may have in flight; each waits 0.05 s after
a refusal), so A keeps up to 64 ledger calls queued; tenant B sends one request every
0.25 s. Thousands of clients would measure the event loop instead: their refusals
saturate it. The reference replaces the ledger's executor by the one before tenants took
turns: a first-come, first-served pool of 8 threads (sentdp now uses one thread for
SQLite, 8 for PostgreSQL with at most 4 per tenant). Settings alternate, each run twice;
the table gives B's latencies and A's answers, and the ratio of B's medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for tests
from sentdp.text import TextLimits
from service.charging import LEDGER_THREADS, ChargedRequest, Charging
from service.idempotency import BodySigner, caller_secret
from service.ledger import open_ledger
from service.ledger.postgres import PostgresLedger
from service.schemas import DocumentIn, WorkRequest, WorkResult
from service.tenants import Tenant
from service.validation import Limits
from tests.service.fakes import FakeWorker, tiny_bundle

A = Tenant(id="flood", key_sha256=["a" * 64], max_epsilon=10, group_size=1, budget=1e9)
B = Tenant(id="calm", key_sha256=["b" * 64], max_epsilon=10, group_size=1, budget=1e9)


class FirstComeFirstServed:
    """The reference: the ledger's threads in one queue, whatever the key."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="reference-ledger")

    def submit(self, key: Hashable, function: Callable[..., Any], *args: Any) -> Future[Any]:
        return self._pool.submit(function, *args)

    def for_key(self, key: Hashable) -> ThreadPoolExecutor:
        return self._pool


async def flood_and_calm(flow: Charging, seconds: float, clients: int) -> dict[str, Any]:
    stop = time.perf_counter() + seconds
    flood: Counter[int] = Counter()
    calm: list[float] = []
    calm_statuses: Counter[int] = Counter()

    def ask(tenant: Tenant, user: str, text: str) -> ChargedRequest:
        document = DocumentIn.model_validate({"sentences": [text]})
        caller = caller_secret(f"{tenant.id}-api-key")
        return ChargedRequest(
            tenant=tenant, user=user, epsilon=2.0, documents=[document], caller=caller
        )

    async def flooder(n: int) -> None:
        sent = 0
        while time.perf_counter() < stop:
            reply = await flow.handle(ask(A, f"a{n}", f"Flood {n} sentence {sent}."))
            flood[reply.status] += 1
            sent += 1
            if reply.status != 200:
                await asyncio.sleep(0.05)

    async def calm_user() -> None:
        await asyncio.sleep(2)  # the flood is in full swing
        n = 0
        while time.perf_counter() < stop:
            started = time.perf_counter()
            reply = await flow.handle(ask(B, f"b{n}", f"An ordinary sentence {n}."))
            calm.append(time.perf_counter() - started)
            calm_statuses[reply.status] += 1
            n += 1
            await asyncio.sleep(0.25)

    await asyncio.gather(calm_user(), *(flooder(n) for n in range(clients)))
    return {"flood": dict(flood), "calm": calm, "calm_statuses": dict(calm_statuses)}


def run_once(fair: bool, seconds: float, clients: int, url: str | None) -> dict[str, Any]:
    bundle = tiny_bundle()
    fake = FakeWorker(bundle)

    async def worker(work: WorkRequest) -> list[WorkResult]:
        await asyncio.sleep(0.005)
        return await fake(work)

    limits = Limits(16, TextLimits(), tenant_inflight_tokens=40_000, tenant_inflight_requests=64)
    with tempfile.TemporaryDirectory(prefix="sentdp-ledger-fairness-") as scratch:
        if url is None:
            ledger = open_ledger(f"sqlite:///{Path(scratch) / 'ledger.sqlite3'}")
        else:
            ledger = open_ledger(url, schema=f"fairness_{uuid.uuid4().hex[:12]}")
        flow = Charging(bundle, "sentdp-unit:v1", ledger, worker, limits, BodySigner(b"k" * 32))
        if not fair:
            flow._ledger_calls = FirstComeFirstServed(LEDGER_THREADS)  # type: ignore[assignment]
        try:
            return asyncio.run(flood_and_calm(flow, seconds, clients))
        finally:
            ledger.close()
            if isinstance(ledger, PostgresLedger):
                ledger.drop_schema()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="at least 5")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--ledger-url", help="a PostgreSQL URL (default: a SQLite file)")
    args = parser.parse_args()
    if args.seconds < 5:
        parser.error("--seconds must be at least 5 (the calm tenant starts after 2 s)")
    names = {False: "8, first come, first served (reference)", True: "tenants in turns"}
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(2):
        for fair in (False, True):
            runs[fair].append(run_once(fair, args.seconds, args.clients, args.ledger_url))
            print(f"ran {names[fair]}", flush=True)
    print(
        f"\ntenant A: {args.clients} closed-loop clients of one-sentence requests for "
        f"{args.seconds:.0f} s; tenant B: one request every 0.25 s; "
        f"{'PostgreSQL' if args.ledger_url else 'SQLite'}\n"
    )
    print("ledger threads | B's requests, p50 / max (s), per run | B statuses | A statuses")
    medians = {}
    for fair, results in runs.items():
        spans = []
        for r in results:
            spans.append(
                f"{len(r['calm'])}: {statistics.median(r['calm']):.4f} / {max(r['calm']):.4f}"
            )
        medians[fair] = statistics.median([statistics.median(r["calm"]) for r in results])
        calm: Counter[int] = Counter()
        flood: Counter[int] = Counter()
        for r in results:
            calm.update(r["calm_statuses"])
            flood.update(r["flood"])
        print(f"{names[fair]} | {'; '.join(spans)} | {dict(calm)} | {dict(flood)}")
    print(f"\nB's median latency, in turns / first come: {medians[True] / medians[False]:.2f}")


if __name__ == "__main__":
    main()
