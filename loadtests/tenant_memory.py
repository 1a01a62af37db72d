"""Memory one tenant's queued requests hold in the server, with and without the bound on its
bodies in flight (``SENTDP_TENANT_INFLIGHT_BYTES``), in one run.

Run: ``.venv/bin/python loadtests/tenant_memory.py TAG [--seconds 20] [--concurrency 96]``

One tenant runs ``--concurrency`` closed-loop clients of about 2 MiB bodies (1,000
sentences of 2,000 characters: valid, slow to check, and then refused as too much work, so
nothing is charged; a client waits 0.05 s after any refusal, in both settings) while another
tenant sends a one-sentence request every half second. For each setting the
table gives the server's peak resident memory (every process, sampled every 0.2 s) above
its idle level, the flood's statuses, and the other tenant's latencies. The reference is
the same server with the bound set to 1 GiB, which no flood here reaches (the behaviour
before the bound); settings alternate, the reference first in each pair, each started
twice.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for tests.support
from loadtests.bench_service import RssSampler
from tests.support import TENANTS, Server, write_tenants

UNBOUNDED = str(1 << 30)


def flood_body() -> bytes:
    sentences = [f"Sentence {n} " + "word " * 396 + "end." for n in range(1000)]
    text = '{"user": "flood", "epsilon": 1.0, "documents": [{"sentences": ['
    text += ", ".join(f'"{s}"' for s in sentences) + "]}]}"
    return text.encode()


async def flood_and_calm(server: Server, seconds: float, concurrency: int) -> dict[str, Any]:
    body = flood_body()
    flood: Counter[int] = Counter()
    calm: list[tuple[int, float]] = []
    stop = time.perf_counter() + seconds
    flood_headers = {
        "Authorization": f"Bearer {TENANTS[0].key}",
        "Content-Type": "application/json",
    }
    calm_headers = {"Authorization": f"Bearer {TENANTS[1].key}"}
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as http:

        async def flooder() -> None:
            while time.perf_counter() < stop:
                try:
                    response = await http.post("/privatize", content=body, headers=flood_headers)
                    status = response.status_code
                except httpx.HTTPError:
                    status = 0  # the connection failed: counted, the flood goes on
                flood[status] += 1
                if status != 200:
                    await asyncio.sleep(0.05)

        async def calm_user() -> None:
            await asyncio.sleep(2)  # the flood's queue has built up
            n = 0
            while time.perf_counter() < stop:
                request = {
                    "user": f"calm-{n}",
                    "epsilon": 1.0,
                    "documents": [{"text": f"A short note number {n}."}],
                }
                started = time.perf_counter()
                try:
                    response = await http.post("/privatize", json=request, headers=calm_headers)
                    status = response.status_code
                except httpx.HTTPError:
                    status = 0
                calm.append((status, time.perf_counter() - started))
                n += 1
                await asyncio.sleep(0.5)

        await asyncio.gather(calm_user(), *(flooder() for _ in range(concurrency)))
    return {"flood": dict(flood), "calm": calm}


def run_once(model: str, bound: str | None, seconds: float, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sentdp-tenant-memory-") as scratch:
        folder = Path(scratch)
        env = {
            "SENTDP_MODEL": model,
            "SENTDP_TENANTS_FILE": str(write_tenants(folder / "tenants.json")),
            "SENTDP_LEDGER_URL": f"sqlite:///{folder / 'ledger.sqlite3'}",
        }
        if bound is not None:
            env["SENTDP_TENANT_INFLIGHT_BYTES"] = bound
        server = Server(env, log=folder / "server.log").start()
        try:
            time.sleep(2)
            idle = server.rss_bytes()
            sampler = RssSampler(server, interval=0.2)
            sampler.start()
            result = asyncio.run(flood_and_calm(server, seconds, concurrency))
            sampler.running = False
            sampler.join()
        finally:
            server.stop()
    result["idle"] = idle
    result["peak"] = sampler.peak
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--seconds", type=float, default=20.0, help="at least 5")
    parser.add_argument("--concurrency", type=int, default=96)
    args = parser.parse_args()
    if args.seconds < 5:
        parser.error("--seconds must be at least 5 (the other tenant starts after 2 s)")
    rows: dict[str, list[dict[str, Any]]] = {"1 GiB (reference)": [], "default": []}
    for _ in range(2):
        for name, bound in (("1 GiB (reference)", UNBOUNDED), ("default", None)):
            rows[name].append(run_once(args.model, bound, args.seconds, args.concurrency))
            print(f"ran {name}", flush=True)
    print(
        f"\none tenant runs {args.concurrency} closed-loop clients of "
        f"{len(flood_body()) / 2**20:.1f} MiB bodies for {args.seconds:.0f} s; another sends "
        "one sentence every 0.5 s\n"
    )
    print("bound on bytes in flight | peak RSS growth (MiB) | flood statuses | calm p50/max (s)")
    growth: dict[str, float] = {}
    for name, runs in rows.items():
        grown = [(r["peak"] - r["idle"]) / 2**20 for r in runs]
        growth[name] = statistics.median(grown)
        statuses: Counter[int] = Counter()
        for r in runs:
            statuses.update(r["flood"])
        calm = [s for r in runs for _, s in r["calm"]]
        calm_codes = Counter(c for r in runs for c, _ in r["calm"])
        print(
            f"{name} | {', '.join(f'{g:.0f}' for g in grown)} | {dict(statuses)} | "
            f"{statistics.median(calm):.2f}/{max(calm):.2f} {dict(calm_codes)}"
        )
    ratio = growth["default"] / growth["1 GiB (reference)"]
    print(f"\nmedian growth, default / reference: {ratio:.2f}")


if __name__ == "__main__":
    main()
