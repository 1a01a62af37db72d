"""How long the purge of expired idempotency keys holds a SQLite ledger: one transaction for
all of them (the reference, as before) against chunks of ``PURGE_CHUNK_ROWS`` (each the
pause one reservation adds, and while it runs, every other ledger call of the process), and
the WAL checkpoint the gateway's housekeeping timer runs after a purge that deleted rows
(while it runs, writers of every process wait).

Run: ``.venv/bin/python loadtests/ledger_purge.py [--expired 6000] [--fresh 20000]``

Each run fills a fresh SQLite ledger with ``--expired`` keys past their 24 h window and
``--fresh`` keys inside it, each holding a 5 KB reply (one 384-float embedding), as a
minute's expired keys at 100 requests/s would be; medians of three runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from service.ledger import open_ledger
from service.ledger.sql import PURGE_CHUNK_ROWS
from service.ledger.types import IDEMPOTENCY_TTL_SECONDS

REPLY = json.dumps({"documents": [{"embedding": [0.123456789] * 384}]})


def filled(folder: Path, expired: int, fresh: int, now: float):  # type: ignore[no-untyped-def]
    ledger = open_ledger(f"sqlite:///{folder / 'ledger.sqlite3'}")
    old = now - IDEMPOTENCY_TTL_SECONDS - 3600
    rows = [
        ("acme", f"u{i % 500}", f"k{i}", "h", "done", REPLY, old + i * 0.01 if i < expired else now)
        for i in range(expired + fresh)
    ]
    with ledger.transaction() as cur:
        cur.executemany(
            "INSERT INTO sentdp_idempotency (tenant, user_id, key, body_hmac, state, response, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    return ledger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expired", type=int, default=6000)
    parser.add_argument("--fresh", type=int, default=20000)
    args = parser.parse_args()
    whole, longest, total, checkpoints, chunks = [], [], [], [], 0
    for _ in range(3):
        now = time.time()
        with tempfile.TemporaryDirectory() as scratch:
            ledger = filled(Path(scratch), args.expired, args.fresh, now)
            start = time.perf_counter()
            assert ledger.purge_expired(now) == args.expired
            whole.append(time.perf_counter() - start)
            ledger.close()
        with tempfile.TemporaryDirectory() as scratch:
            ledger = filled(Path(scratch), args.expired, args.fresh, now)
            pauses = []
            while True:
                start = time.perf_counter()
                deleted = ledger.purge_expired(now, PURGE_CHUNK_ROWS)
                pauses.append(time.perf_counter() - start)
                if deleted < PURGE_CHUNK_ROWS:
                    break
            longest.append(max(pauses))
            total.append(sum(pauses))
            chunks = len(pauses)
            start = time.perf_counter()
            ledger.scrub()
            checkpoints.append(time.perf_counter() - start)
            ledger.close()
    ms = 1000 * statistics.median(whole)
    print(f"{args.expired} expired keys of {args.expired + args.fresh}, 5 KB replies, SQLite")
    print(f"{'purge':38s} {'longest pause ms':>17s} {'total ms':>9s} {'x pause':>8s}")
    print(f"{'one transaction (before)':38s} {ms:17.1f} {ms:9.1f} {1.0:8.2f}")
    label = f"{chunks} chunks of {PURGE_CHUNK_ROWS} (now)"
    pause, spent = 1000 * statistics.median(longest), 1000 * statistics.median(total)
    print(f"{label:38s} {pause:17.1f} {spent:9.1f} {pause / ms:8.2f}")
    label = "then the timer's WAL checkpoint"
    check = 1000 * statistics.median(checkpoints)
    print(f"{label:38s} {check:17.1f} {check:9.1f} {check / ms:8.2f}")


if __name__ == "__main__":
    main()
