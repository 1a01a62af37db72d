"""What one caller can make a fresh worker compute through the hard-vote tables: labels at
every table epsilon of the grid, from the smallest that has a table up to ``--top``, each
grid point's tables for documents of 1 to the bundle's limit made once (a fresh process,
nothing cached), against making the tables of one epsilon (the reference: what the first
label at one new epsilon makes).

Run: ``.venv/bin/python loadtests/table_sweep.py [--classes 13] [--limits 9 3] [--split 3]``
(the clothing reviews bundle's limits: 9 sentences below epsilon 3, 3 from 3 up to ``--top``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from sentdp.vote_table import EPSILON_STEPS, makes_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=13)
    parser.add_argument("--limits", type=int, nargs=2, default=(9, 3))
    parser.add_argument("--split", type=float, default=3.0)
    parser.add_argument("--top", type=float, default=6.0)
    args = parser.parse_args()
    low, high = args.limits
    first = -EPSILON_STEPS * 9  # 2**-9: below the smallest epsilon with a table
    grid = [
        2.0 ** (k / EPSILON_STEPS)
        for k in range(first, math.ceil(EPSILON_STEPS * math.log2(args.top)))
    ]
    points, made = [], 0  # seconds per grid epsilon that has tables
    for epsilon in grid:
        started = time.perf_counter()
        here = sum(  # makes_table makes (and caches) the table it answers for
            makes_table(sentences, args.classes, epsilon)
            for sentences in range(1, (low if epsilon < args.split else high) + 1)
        )
        if here:
            points.append(time.perf_counter() - started)
            made += here
    total = sum(points)
    print(f"r = {args.classes}, limits {low} below epsilon {args.split:g}, {high} to {args.top:g}")
    print(f"{'measurement':<44}{'tables':>8}{'seconds':>10}")
    print(
        f"{'every grid epsilon (' + str(len(points)) + ' with tables)':<44}{made:>8}{total:>10.1f}"
    )
    print(f"{'one grid epsilon, median':<44}{'':>8}{statistics.median(points):>10.3f}")
    print(f"{'one grid epsilon, largest':<44}{'':>8}{max(points):>10.3f}")
    print(f"ratio, all against the median epsilon: {total / statistics.median(points):.0f}x")


if __name__ == "__main__":
    main()
