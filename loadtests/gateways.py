"""Throughput, latency, cold start and peak RSS with 2 and with 1 gateway process, alternating.

Run: ``.venv/bin/python loadtests/gateways.py TAG``

The gateway is asynchronous and adds little per request (see bench_service.py's breakdown);
this measures what a second gateway process buys on this machine and what it costs in
memory: 96 BBC News test documents at concurrency 1 and 32, each setting started twice.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loadtests.bench_service import RssSampler, load, load_documents, serve


def main() -> None:
    documents = load_documents(104, seed=1)
    warmup, measured = documents[:8], documents[8:]
    for gateways in ("2", "1", "2", "1"):
        os.environ["SENTDP_GATEWAY_WORKERS"] = gateways
        with tempfile.TemporaryDirectory(prefix="sentdp-gateways-") as scratch:
            server = serve(sys.argv[1], Path(scratch), batching=True)
            sampler = RssSampler(server)
            sampler.start()
            try:
                load(server, warmup, 4)
                results = {c: load(server, measured, c) for c in (1, 32)}
            finally:
                sampler.running = False
                sampler.join()
                server.stop()
            rates = ", ".join(
                f"c{c} {r['sentences_per_s']:.1f} sent/s p50 {r['p50']:.2f} p99 {r['p99']:.2f}"
                for c, r in results.items()
            )
            print(
                f"gateways {gateways}: cold start {server.cold_start_seconds:.1f} s, "
                f"peak RSS {sampler.peak / 2**20:.0f} MiB, {rates}",
                flush=True,
            )


if __name__ == "__main__":
    main()
