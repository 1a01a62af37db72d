"""Cold start and peak memory of the whole server, per bundle, without the full benchmark.

Run: ``.venv/bin/python loadtests/cold_start.py TAG [TAG ...]``

For each bundle: launch ``bentoml serve`` (the default gateway processes: one on 2 cores; one
worker), time launch to the first /readyz 200, send 16 BBC News test documents at
concurrency 4, and print the cold start, the worker's encoder mode and the peak resident
memory of all server processes.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loadtests.bench_service import RssSampler, encoder_mode, load, load_documents, serve


def main() -> None:
    documents = load_documents(16, seed=1)
    for model in sys.argv[1:]:
        with tempfile.TemporaryDirectory(prefix="sentdp-cold-") as scratch:
            server = serve(model, Path(scratch), batching=True)
            sampler = RssSampler(server)
            sampler.start()
            try:
                asyncio.run(load(server, documents, 4))
                time.sleep(1)
            finally:
                sampler.running = False
                sampler.join()
                server.stop()
            print(
                f"{model}: cold start {server.cold_start_seconds:.1f} s, encoder mode "
                f"{encoder_mode(server)}, peak RSS {sampler.peak / 2**20:.0f} MiB",
                flush=True,
            )


if __name__ == "__main__":
    main()
