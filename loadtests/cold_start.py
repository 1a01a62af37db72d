"""Cold start and peak memory of the whole server, per bundle, without the full benchmark.

Run: ``.venv/bin/python loadtests/cold_start.py TAG [TAG ...] [--documents N --concurrency C]``

For each bundle: launch ``bentoml serve`` (the default gateway processes: one on 2 cores; one
worker), time launch to the first /readyz 200, send BBC News test documents (16 at
concurrency 4 by default; 160 at 32 is the full load of ``bench_service.py``), and print the
cold start, the worker's encoder mode, the sentences/s and the peak resident memory of all
server processes (sampled every 0.5 s). Settings come from the environment, e.g.
``SENTDP_ENCODE_BATCH_SIZE``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loadtests.bench_service import RssSampler, encoder_mode, load, load_documents, serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="bundle tags, served one after another")
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    documents = load_documents(args.documents, seed=1)
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="sentdp-cold-") as scratch:
            server = serve(model, Path(scratch), batching=True)
            sampler = RssSampler(server)
            sampler.start()
            try:
                result = load(server, documents, args.concurrency)
                time.sleep(1)
            finally:
                sampler.running = False
                sampler.join()
                server.stop()
            print(
                f"{model}: cold start {server.cold_start_seconds:.1f} s, encoder mode "
                f"{encoder_mode(server)}, {args.documents} documents at concurrency "
                f"{args.concurrency}: {result['sentences_per_s']:.1f} sentences/s, "
                f"{result['failures']} failed, peak RSS {sampler.peak / 2**20:.0f} MiB",
                flush=True,
            )


if __name__ == "__main__":
    main()
