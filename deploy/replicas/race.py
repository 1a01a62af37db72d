"""The budget race across replicas: N concurrent /privatize calls for one user whose budget
pays for exactly one. Every call has its own Idempotency-Key, so each is a new charge.

    .venv/bin/python deploy/replicas/race.py http://127.0.0.1:3000 <API key> [--calls 200]

Prints the statuses seen and exits 1 unless exactly one call was admitted and every other
was refused with 402.
"""

from __future__ import annotations

import argparse
import collections
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("key")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--user", default=f"racer-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args()
    body = {"user": args.user, "epsilon": 1.0, "documents": [{"text": "One claim. Two claims."}]}
    limits = httpx.Limits(max_connections=args.calls)
    with httpx.Client(base_url=args.url, timeout=180, limits=limits) as http:

        def call(_: int) -> int:
            headers = {"Authorization": f"Bearer {args.key}", "Idempotency-Key": uuid.uuid4().hex}
            return http.post("/privatize", json=body, headers=headers).status_code

        with ThreadPoolExecutor(max_workers=args.calls) as pool:
            statuses = collections.Counter(pool.map(call, range(args.calls)))
    print(f"user {args.user}: {dict(sorted(statuses.items()))} from {args.calls} concurrent calls")
    if statuses != collections.Counter({200: 1, 402: args.calls - 1}):
        sys.exit("FAILED: expected exactly one 200 and the rest 402")
    print("exactly one call admitted across the replicas")
    print(f"USER={args.user}")


if __name__ == "__main__":
    main()
