"""The GPU section of docs/performance.md shows what the lease's raw benchmark files say."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEASE = ROOT / "reports" / "gpu" / "h100-workers"
SERVER = re.compile(r"torch, batching on, 8 gateways(?:, (\d) workers)?, concurrency (\d+)\s+(.*)$")


def table_rows(run: int) -> list[str]:
    """The notes' rows for one run, built from bench_service's first two tables."""
    figures: dict[tuple[int, int], list[str]] = {}
    breakdown: dict[tuple[int, int], list[str]] = {}
    text = (LEASE / f"service-{run}.txt").read_text()
    for line in text.splitlines():
        match = SERVER.match(line)
        if match is None:
            continue
        key = (int(match.group(1) or 1), int(match.group(2)))
        values = match.group(3).split()
        if len(values) == 8:  # throughput first, then the breakdown (cores have 5 columns)
            (breakdown if key in figures else figures)[key] = values
    assert figures
    assert figures.keys() == breakdown.keys()
    rows = []
    for (workers, concurrency), (sent, _, x_st, x_own, p50, _, p99, failed) in figures.items():
        assert failed == "0"
        batch, encode, batches = (breakdown[workers, concurrency][i] for i in (3, 4, 6))
        rows.append(
            f"| {run} | {workers} | {concurrency} | {float(sent):,.1f} | {x_st} | {x_own} | "
            f"{p50} | {p99} | {float(batch):.3f} ({float(encode):.3f}) | {batches} |"
        )
    return rows


def test_the_notes_table_equals_the_raw_files() -> None:
    notes = (ROOT / "docs" / "performance.md").read_text()
    rows = table_rows(1) + table_rows(2)
    assert len(rows) == 15
    for row in rows:
        assert row in notes
