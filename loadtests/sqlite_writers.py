"""Two processes writing one SQLite ledger: with the writers' queue (an ``flock`` of
``<ledger>.writers`` before ``BEGIN IMMEDIATE``) and with SQLite's busy handler alone, in one
run.

Run: ``.venv/bin/python loadtests/sqlite_writers.py [--seconds 4]``

Like two gateway processes on one SQLite ledger while a tenant floods one of them: process
A commits write transactions back to back through ``SqliteLedger.transaction`` (WAL,
``synchronous=FULL``, the ledger's own connection settings); process B commits one every
10 ms and times each from its start to its commit. The table gives both processes'
commits and B's waits; settings alternate, each run twice.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout
from service.ledger.sqlite import SqliteLedger


def writer(path: str, queue: bool, seconds: float, paced: bool, out: Any) -> None:
    ledger = SqliteLedger(Path(path), queue_writers=queue)
    waits: list[float] = []
    commits = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        began = time.perf_counter()
        try:
            with ledger.transaction() as cur:
                cur.execute("INSERT INTO bench (process, at) VALUES (?, ?)", (paced, began))
        except Exception:  # a refusal (database locked) counts as a failure
            waits.append(float("inf"))
            continue
        waits.append(time.perf_counter() - began)
        commits += 1
        if paced:
            time.sleep(0.01)
    ledger.close()
    out.put((paced, commits, waits))


def run_once(queue: bool, seconds: float) -> dict[bool, tuple[int, list[float]]]:
    with tempfile.TemporaryDirectory(prefix="sentdp-sqlite-writers-") as scratch:
        path = Path(scratch) / "ledger.sqlite3"
        ledger = SqliteLedger(path)
        with ledger.transaction() as cur:
            cur.execute("CREATE TABLE bench (process INTEGER, at REAL)")
        ledger.close()
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        processes = [
            context.Process(target=writer, args=(str(path), queue, seconds, paced, out))
            for paced in (False, True)
        ]
        for process in processes:
            process.start()
        results = {}
        for _ in processes:
            paced, commits, waits = out.get(timeout=seconds + 120)
            results[paced] = (commits, waits)
        for process in processes:
            process.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    names = {False: "busy handler alone (reference)", True: "writers' queue (flock)"}
    rows: dict[bool, list[dict[bool, tuple[int, list[float]]]]] = {False: [], True: []}
    for _ in range(2):
        for queue in (False, True):
            rows[queue].append(run_once(queue, args.seconds))
    print(
        f"\nA commits back to back, B once every 10 ms, for {args.seconds:.0f} s each run; "
        "WAL, synchronous=FULL\n"
    )
    print("writers | A commits | B commits | B's wait p50 / max (ms) | B failures")
    for queue, runs in rows.items():
        a = ", ".join(str(r[False][0]) for r in runs)
        b = ", ".join(str(r[True][0]) for r in runs)
        waits = []
        for r in runs:
            done = [w for w in r[True][1] if w != float("inf")]
            waits.append(
                f"{statistics.median(done) * 1000:.1f} / {max(done) * 1000:.0f}" if done else "-"
            )
        failures = sum(sum(1 for w in r[True][1] if w == float("inf")) for r in runs)
        print(f"{names[queue]} | {a} | {b} | {'; '.join(waits)} | {failures}")


if __name__ == "__main__":
    main()
