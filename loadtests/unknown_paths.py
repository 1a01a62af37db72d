"""What requests for paths no route serves cost a server, against the same number of
requests for one known path, in one run.

Run: ``.venv/bin/python loadtests/unknown_paths.py TAG [--requests 5000]``

BentoML labels its HTTP metrics with the request's path. Until sentdp bounded that label,
every made-up path (answered 404, no API key needed) added about 20 series for good: memory
in each process, a file's worth of bytes in the shared metrics folder on disk, and lines in
``/metrics``. The script starts one server, sends ``--requests`` GETs to ``/readyz`` (the
reference: one known path), then as many to distinct made-up paths, and after each phase
reads the server's resident memory (every process), the size of its metrics folder and of
``/metrics``. It prints the growth of each phase and the ratio made-up / reference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for tests.support
from tests.support import METRICS_TOKEN, Server, write_tenants


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def snapshot(server: Server, http: httpx.Client) -> tuple[int, int, int]:
    """Resident memory, metrics folder bytes and /metrics bytes, after a moment's rest."""
    time.sleep(1.0)
    metrics = http.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert metrics.status_code == 200, metrics.status_code
    return (
        server.rss_bytes(),
        folder_bytes(server.home / "prometheus_multiproc_dir"),
        len(metrics.content),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sentdp-unknown-paths-") as scratch:
        folder = Path(scratch)
        env = {
            "SENTDP_MODEL": args.model,
            "SENTDP_TENANTS_FILE": str(write_tenants(folder / "tenants.json")),
            "SENTDP_LEDGER_URL": f"sqlite:///{folder / 'ledger.sqlite3'}",
            "SENTDP_METRICS_TOKEN": METRICS_TOKEN,
        }
        server = Server(env, log=folder / "server.log").start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as http:
                before = snapshot(server, http)
                started = time.perf_counter()
                for _ in range(args.requests):
                    http.get("/readyz")
                known_seconds = time.perf_counter() - started
                known = snapshot(server, http)
                started = time.perf_counter()
                statuses = set()
                for n in range(args.requests):
                    statuses.add(http.get(f"/made-up-{n}-" + "x" * 100).status_code)
                made_up_seconds = time.perf_counter() - started
                made_up = snapshot(server, http)
        finally:
            server.stop()
    mib = 2**20
    print(f"{args.requests} requests per phase; made-up paths answered {sorted(statuses)}\n")
    columns = ("seconds", "RSS growth MiB", "folder growth MiB", "/metrics growth KiB")
    print(f"{'phase':26} | " + " | ".join(columns))
    rows = {
        "one known path (reference)": (known_seconds, before, known),
        "distinct made-up paths": (made_up_seconds, known, made_up),
    }
    growth = {}
    for name, (seconds, start, end) in rows.items():
        rss, disk, text = (end[i] - start[i] for i in range(3))
        growth[name] = (rss, disk, text)
        print(
            f"{name:26} | {seconds:7.1f} | {rss / mib:14.1f} | {disk / mib:17.2f} | "
            f"{text / 1024:19.1f}"
        )
    ref, new = growth["one known path (reference)"], growth["distinct made-up paths"]
    print(
        f"\nmade-up minus reference: RSS {(new[0] - ref[0]) / mib:.1f} MiB, folder "
        f"{(new[1] - ref[1]) / mib:.2f} MiB, /metrics {(new[2] - ref[2]) / 1024:.1f} KiB; "
        f"RSS growth made-up / reference: {new[0] / max(ref[0], 1):.2f}"
    )


if __name__ == "__main__":
    main()
