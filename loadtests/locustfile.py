"""Locust scenario: product backends privatizing their users' documents.

Run headless against a running server (see README)::

    SENTDP_LOCUST_KEY=$(cat .sentdp/demo-api-key) .venv/bin/locust -f loadtests/locustfile.py \\
        --headless -u 16 -r 4 -t 60s --host http://127.0.0.1:3000 --csv reports/locust

Each simulated backend serves a pool of end users and sends real BBC News test documents
(realistic lengths, 2 to 50 sentences) as raw text. The mix per backend: /privatize (6),
/classify with documents (2), /classify lookups of released candidates (1), /budget (1). One
request in ten is retried with the same Idempotency-Key (a replay, not charged); heavy users
spend their budget and then get 402, which counts as an expected outcome, not a failure.

Settings (environment): SENTDP_LOCUST_KEY (API key, required), SENTDP_LOCUST_USERS (end users
per backend, default 50), SENTDP_LOCUST_EPSILON (default 3).
"""

from __future__ import annotations

import os
import random
import uuid
from collections import Counter
from functools import lru_cache

from locust import HttpUser, between, events, task

HEAVY_USERS = [f"heavy-{n}" for n in range(3)]
"""Shared by every backend, so they run out of budget within a short run."""
exhausted: Counter[str] = Counter()


@lru_cache(maxsize=1)
def documents() -> list[str]:
    """BBC News test-split articles, from the sha256-verified corpus cache."""
    from sentdp.text import TextLimits
    from training.datasets import REGISTRY, stratified_splits
    from training.settings import load_settings

    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    test = stratified_splits(corpus, 0).test
    return [
        " ".join(corpus.documents[i].sentences)
        for i in test
        if 2 <= len(corpus.documents[i].sentences) <= 50
    ]


@events.init.add_listener
def _check_settings(environment, **_kwargs) -> None:  # type: ignore[no-untyped-def]
    if not os.environ.get("SENTDP_LOCUST_KEY"):
        raise SystemExit("set SENTDP_LOCUST_KEY to a tenant's API key")
    documents()


@events.quitting.add_listener
def _report_exhausted(environment, **_kwargs) -> None:  # type: ignore[no-untyped-def]
    print(f"402 budget exhausted (expected, counted as success): {dict(exhausted)}")


class ProductBackend(HttpUser):
    """One product backend, calling sentdp on behalf of its end users."""

    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        self.client.headers["Authorization"] = f"Bearer {os.environ['SENTDP_LOCUST_KEY']}"
        self.users = [
            f"user-{uuid.uuid4().hex[:8]}"
            for _ in range(int(os.environ.get("SENTDP_LOCUST_USERS", "50")))
        ]
        self.epsilon = float(os.environ.get("SENTDP_LOCUST_EPSILON", "3"))
        self.released: list[tuple[str, int]] = []

    def _user(self) -> str:
        # A few heavy users send a large share of the documents and run out of budget.
        return random.choice(HEAVY_USERS) if random.random() < 0.3 else random.choice(self.users)

    def _charged(self, path: str, name: str) -> None:
        body = {
            "user": self._user(),
            "epsilon": self.epsilon,
            "documents": [{"text": random.choice(documents())}],
        }
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        retry = random.random() < 0.1
        for attempt in range(2 if retry else 1):
            with self.client.post(
                path,
                json=body,
                headers=headers,
                name=name + (" (retry)" if attempt else ""),
                catch_response=True,
            ) as response:
                if response.status_code == 200:
                    data = response.json()
                    candidate = data["documents"][0].get("candidate")  # none for a vote label
                    if candidate is not None:
                        self.released.append((data["model"], candidate))
                        self.released = self.released[-100:]
                    response.success()
                elif response.status_code == 402:
                    exhausted[name] += 1
                    response.success()  # budget exhausted: the expected answer
                else:
                    response.failure(f"{response.status_code}: {response.text[:200]}")

    @task(6)
    def privatize(self) -> None:
        self._charged("/privatize", "/privatize")

    @task(2)
    def classify(self) -> None:
        self._charged("/classify", "/classify documents")

    @task(1)
    def lookup(self) -> None:
        if not self.released:
            return
        model, candidate = random.choice(self.released)
        self.client.post(
            "/classify", json={"model": model, "candidates": [candidate]}, name="/classify lookup"
        )

    @task(1)
    def budget(self) -> None:
        self.client.post("/budget", json={"user": self._user()}, name="/budget")
