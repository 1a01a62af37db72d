"""End-to-end throughput of the service against the encoder's own limit, in one run.

Run: ``.venv/bin/python loadtests/bench_service.py [--model sentdp-bbc-news:latest]``

1. raw encoder: sentence-transformers ``encode`` of the same documents' sentences in this
   process, in batches of the service's encoder batch size, with the worker's thread count:
   the ceiling the service cannot exceed (and sentdp's bucketed encoder, for comparison);
2. the service over HTTP (``bentoml serve``, 2 gateway workers, one worker process) at
   concurrency 1, 8 and 32, one real BBC News test document per request: sentences/s,
   documents/s, p50/p95/p99 latency, and the ratio to the raw encoder;
3. the same with adaptive batching off (the gateway calls the worker's non-batchable twin).

Also reported: cold start (launch to /readyz 200) and the peak resident memory of the whole
server. Figures are medians where repeated; the ratio column is the one to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for tests.support
from tests.support import TENANTS, Server, write_tenants

THREADS = 2


def load_documents(count: int, seed: int) -> list[list[str]]:
    """Real documents: BBC News test-split articles, as the service would split them."""
    from sentdp.text import TextLimits
    from training.datasets import REGISTRY, stratified_splits
    from training.settings import load_settings

    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    test = stratified_splits(corpus, 0).test
    rng = np.random.default_rng(seed)
    chosen = rng.choice(test, size=min(count, len(test)), replace=False)
    return [list(corpus.documents[int(i)].sentences) for i in chosen]


def raw_encoder_rates(documents: list[list[str]], model_dir: Path, batch: int) -> dict[str, float]:
    import torch
    from sentence_transformers import SentenceTransformer

    from sentdp.encoders import SentenceEncoder

    torch.set_num_threads(THREADS)
    sentences = [s for doc in documents for s in doc]
    plain = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    bucketed = SentenceEncoder(model_dir, "cpu", batch)
    rates = {}
    for name, encode in (
        ("sentence-transformers encode", lambda: plain.encode(sentences, batch_size=batch)),
        ("sentdp bucketed encoder", lambda: bucketed.encode(sentences)),
    ):
        encode()  # warm up
        times = []
        for _ in range(3):
            start = time.perf_counter()
            encode()
            times.append(time.perf_counter() - start)
        rates[name] = len(sentences) / statistics.median(times)
    return rates


class RssSampler(threading.Thread):
    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.peak = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.server.rss_bytes())
            time.sleep(0.5)


async def load(server: Server, documents: list[list[str]], concurrency: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TENANTS[0].key}"}
    queue: asyncio.Queue[tuple[int, list[str]]] = asyncio.Queue()
    for n, doc in enumerate(documents):
        queue.put_nowait((n, doc))
    latencies: list[float] = []
    failures: Counter[int] = Counter()

    async def user(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            n, doc = queue.get_nowait()
            body = {"user": f"bench-{n}", "epsilon": 6.0, "documents": [{"sentences": doc}]}
            start = time.perf_counter()
            response = await http.post("/privatize", json=body)
            latencies.append(time.perf_counter() - start)
            if response.status_code != 200:
                failures[response.status_code] += 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=server.url, headers=headers, timeout=600, limits=limits
    ) as http:
        start = time.perf_counter()
        await asyncio.gather(*(user(http) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    quantiles = np.quantile(latencies, [0.5, 0.95, 0.99])
    return {
        "documents_per_s": len(documents) / wall,
        "sentences_per_s": sum(len(d) for d in documents) / wall,
        "p50": quantiles[0],
        "p95": quantiles[1],
        "p99": quantiles[2],
        "failures": sum(failures.values()),
        "failure_statuses": dict(failures),
    }


def serve(model: str, folder: Path, batching: bool) -> Server:
    tenants = write_tenants(folder / "tenants.json")
    env = {
        "SENTDP_MODEL": model,
        "SENTDP_TENANTS_FILE": str(tenants),
        "SENTDP_LEDGER_URL": f"sqlite:///{folder / f'ledger-{batching}.sqlite3'}",
        "SENTDP_ADAPTIVE_BATCHING": str(batching).lower(),
        "SENTDP_WORKER_THREADS": str(THREADS),
    }
    return Server(env, log=folder / f"server-{batching}.log").start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("SENTDP_MODEL", "sentdp-bbc-news:latest"))
    parser.add_argument("--documents", type=int, default=96, help="documents per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()

    import bentoml

    model_dir = Path(bentoml.models.get(args.model).path) / "encoder"
    documents = load_documents(args.documents + 8, seed=1)
    warmup, measured = documents[:8], documents[8:]
    sentences = sum(len(d) for d in measured)
    print(f"{len(measured)} BBC News test documents, {sentences} sentences, {THREADS} threads")
    raw = raw_encoder_rates(measured, model_dir, batch=64)
    ceiling = raw["sentence-transformers encode"]

    rows: list[tuple[str, dict[str, Any]]] = []
    starts: dict[str, float] = {}
    peaks: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="sentdp-bench-") as scratch:
        for batching in (True, False):
            label = "batching on" if batching else "batching off"
            server = serve(args.model, Path(scratch), batching)
            sampler = RssSampler(server)
            sampler.start()
            try:
                starts[label] = server.cold_start_seconds
                asyncio.run(load(server, warmup, 4))
                for concurrency in args.concurrency:
                    result = asyncio.run(load(server, measured, concurrency))
                    rows.append((f"service, {label}, concurrency {concurrency}", result))
            finally:
                sampler.running = False
                sampler.join()
                peaks[label] = sampler.peak
                server.stop()

    header = ("measurement", "sent/s", "docs/s", "x raw", "p50 s", "p95 s", "p99 s", "fail")
    print("{:44s} {:>8s} {:>7s} {:>6s} {:>7s} {:>7s} {:>7s} {:>5s}".format(*header))
    for name, rate in raw.items():
        print(f"{name:44s} {rate:8.1f} {'':>7s} {rate / ceiling:6.2f}")
    for name, r in rows:
        print(
            f"{name:44s} {r['sentences_per_s']:8.1f} {r['documents_per_s']:7.2f} "
            f"{r['sentences_per_s'] / ceiling:6.2f} {r['p50']:7.2f} {r['p95']:7.2f} "
            f"{r['p99']:7.2f} {r['failures']:5d}"
        )
        if r["failures"]:
            print(f"    failed requests by status: {r['failure_statuses']}")
    for label, seconds in starts.items():
        print(
            f"{label}: cold start (launch to /readyz) {seconds:.1f} s, "
            f"peak RSS of the server {peaks[label] / 2**20:.0f} MiB"
        )


if __name__ == "__main__":
    main()
