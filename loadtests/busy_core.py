"""How the torch encoder's speed holds up when another process keeps part of the CPU busy,
with libgomp's default waiting and with ``OMP_WAIT_POLICY=PASSIVE``, in one run.

Run: ``.venv/bin/python loadtests/busy_core.py [--repeats 2]``

The worker's encoder runs an OpenMP team of ``SENTDP_WORKER_THREADS`` threads (2 on 2 cores); each
parallel region ends at a barrier where team members spin before they sleep. When another
process holds a core, the spinning member and the preempted one take turns, and every region
waits for the slower. Each row encodes the same 600 sentences three times in a fresh
process (the policy must be set before torch starts) next to no competitor, a competitor
busy 30% of every 10 ms, or one busy all the time. The ratio is against the default policy
with no competitor, the median of its runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENCODE = """
import time, torch
from sentdp.encoders import SentenceEncoder
torch.set_num_threads(2)
encoder = SentenceEncoder(None, device="cpu")
sentences = [f"Sentence {n} of a short news story, with a few more words." for n in range(600)]
encoder.encode(sentences[:50])
rates = []
for _ in range(3):
    started = time.perf_counter()
    encoder.encode(sentences)
    rates.append(len(sentences) / (time.perf_counter() - started))
print(sorted(rates)[1])
"""

COMPETITOR = """
import sys, time
duty = float(sys.argv[1])
while True:
    started = time.perf_counter()
    while time.perf_counter() - started < 0.01 * duty:
        pass
    time.sleep(0.01 * (1 - duty))
"""


def encode_rate(policy: str | None, duty: float) -> float:
    """Median of three encodes' sentences/s in a fresh process next to a competitor."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    competitor = None
    if duty > 0:
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR, str(duty)])
        time.sleep(0.3)
    try:
        out = subprocess.run(
            [sys.executable, "-c", ENCODE],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        ).stdout
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for duty, load in ((0.0, "none"), (0.3, "30% of a core"), (1.0, "a whole core")):
            for policy in (None, "PASSIVE"):
                rate = encode_rate(policy, duty)
                rows.setdefault((load, policy or "default"), []).append(rate)
    reference = statistics.median(rows[("none", "default")])
    print("\n600 sentences, all-MiniLM-L6-v2, torch, 2 threads; median of 3 encodes per run")
    print(f"{'competitor':<16}{'OMP_WAIT_POLICY':<17}{'sentences/s per run':<26}x default idle")
    for (load, policy), rates in rows.items():
        runs = ", ".join(f"{r:.0f}" for r in rates)
        ratio = statistics.median(rates) / reference
        print(f"{load:<16}{policy:<17}{runs:<26}{ratio:.2f}")


if __name__ == "__main__":
    main()
