"""``sentdp-audit``: an epsilon audit of a running sentdp deployment, over its public API.

For neighbouring documents D and D' (pre-split sentences, differing in one sentence, built
from public data), the audit privatizes each many times through ``/privatize`` as an ordinary
tenant, maps every response to its outcome (the released candidate id), and bounds the pair's
privacy loss from below (:mod:`evaluation.audit_stats`). Beside each bound it reports the
pair's exact privacy loss under the bundle, computed in-process from the mechanism's exact
probabilities. A lower bound above the declared epsilon proves the deployment broken; a bound
close to the exact loss shows the audit has power.

The audit tenant's budget is spent like any other: create a separate tenant for it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.audit_stats import lower_bound
from sentdp.accounting import charge_for, epsilon_of_charge
from sentdp.bundle import Bundle
from sentdp.encoders import SentenceEncoder, recode
from sentdp.text import SentenceSplitter

Sampler = Callable[[list[str], float, int], list[int]]
"""(sentences, epsilon, n) -> n released candidate ids."""

BATCH = 16
"""Documents per request (the service's default limit): each one is its own sample."""


@dataclass(frozen=True)
class Pair:
    name: str
    d: list[str]
    d2: list[str]


@dataclass(frozen=True)
class PairResult:
    pair: str
    epsilon: float
    exact_epsilon: float
    lower_bound: float
    samples_per_side: int
    direction: str
    event_size: int

    @property
    def flagged(self) -> bool:
        return self.lower_bound > self.epsilon


class ExactLoss:
    """The exact privacy loss of a pair under a bundle, from the mechanism's probabilities."""

    def __init__(self, bundle: Bundle, encoder: SentenceEncoder) -> None:
        self.bundle = bundle
        self.encoder = encoder
        self._known: dict[tuple[tuple[str, ...], float], np.ndarray] = {}

    def log_probs(self, sentences: list[str], epsilon: float) -> np.ndarray:
        """Exact log-probabilities of every candidate (cached: the pair search, the loss and
        the public events all ask for the same documents)."""
        key = (tuple(sentences), epsilon)
        if key not in self._known:
            self._known[key] = self._log_probs(sentences, epsilon)
        return self._known[key]

    def _log_probs(self, sentences: list[str], epsilon: float) -> np.ndarray:
        choice = self.bundle.manifest.choice_for(epsilon)
        variant = self.bundle.variant(choice.variant)
        recoded = recode(variant.recoder, self.encoder.encode(sentences))
        run_at = epsilon_of_charge(charge_for(epsilon))
        return variant.mechanism().log_probs(recoded, run_at, choice.p)

    def __call__(self, pair: Pair, epsilon: float) -> float:
        a, b = self.log_probs(pair.d, epsilon), self.log_probs(pair.d2, epsilon)
        return float(np.max(np.abs(a - b)))

    def events(self, pair: Pair, epsilon: float, samples: int) -> list[set[int]]:
        """Output events chosen from the public bundle alone: the outcomes whose exact
        probability is most raised by D over D' (and the reverse), as many as maximise the
        bound expected from ``samples`` draws per side (global candidate ids)."""
        from evaluation.audit_stats import ratio_bound

        a, b = self.log_probs(pair.d, epsilon), self.log_probs(pair.d2, epsilon)
        offset = self.offset(epsilon)
        events = []
        for first, second in ((a, b), (b, a)):
            order = np.argsort(-(first - second), kind="stable")[:256]
            p, q = np.cumsum(np.exp(first[order])), np.cumsum(np.exp(second[order]))
            expected = [
                ratio_bound(int(p[k] * samples), int(q[k] * samples), samples, samples, 0.05)
                for k in range(len(order))
            ]
            size = int(np.argmax(expected)) + 1
            events.append({offset + int(o) for o in order[:size]})
        return events

    def offset(self, epsilon: float) -> int:
        """Global id of the variant's first candidate (the service releases global ids)."""
        return self.bundle.variant(self.bundle.manifest.choice_for(epsilon).variant).record.offset


OUTLIERS = (
    "Shares in the company, which employs more than 40,000 people in Europe, Asia and the "
    "Americas, fell sharply on Monday after it warned that profits for the year would be far "
    "below what analysts, investors and its own board had been led to expect in the spring.",
    "He said so at 10 a.m. in the U.S.",
    "Wow!",
    "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
)
"""Replacement sentences of unusual shape: very long, abbreviation-ending, tiny, degenerate."""


def adversarial_pairs(
    texts: Sequence[str], loss: ExactLoss, epsilon: float, count: int, seed: int = 0
) -> list[Pair]:
    """Pairs from public documents whose replacement moves the output most (by exact loss),
    plus a one-sentence and a many-sentence document."""
    rng = random.Random(seed)  # noqa: S311 - choosing public documents, not privacy
    splitter = SentenceSplitter()
    documents = [s for s in (splitter.tokenize(t) for t in texts) if 3 <= len(s) <= 12]
    pool = [*OUTLIERS, *(rng.choice(d) for d in rng.sample(documents, 24))]
    pairs = []
    for n, base in enumerate(rng.sample(documents, count)):
        j = rng.randrange(len(base))
        best = max(
            pool, key=lambda r: loss(Pair("", base, [*base[:j], r, *base[j + 1 :]]), epsilon)
        )
        pairs.append(Pair(f"doc{n}-s{j}", base, [*base[:j], best, *base[j + 1 :]]))
    one = rng.choice(documents)[:1]
    pairs.append(Pair("one-sentence", one, [OUTLIERS[0]]))
    many = [s for d in rng.sample(documents, 4) for s in d][:40]
    pairs.append(Pair("many-sentences", many, [*many[:-1], OUTLIERS[1]]))
    return pairs


def http_sampler(url: str, key: str, batch: int = BATCH, user_prefix: str = "audit") -> Sampler:
    """Samples from a live server: ``/privatize`` with up to 16 copies of the document per
    request and a fresh Idempotency-Key each; each response document is one sample."""
    import uuid

    import httpx

    def sample(sentences: list[str], epsilon: float, n: int) -> list[int]:
        out: list[int] = []
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
            while len(out) < n:
                size = min(batch, n - len(out))
                body = {
                    "user": f"{user_prefix}-{uuid.uuid4().hex[:8]}",
                    "epsilon": epsilon,
                    "documents": [{"sentences": sentences}] * size,
                }
                response = http.post(
                    "/privatize", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
                )
                response.raise_for_status()
                out += [int(d["candidate"]) for d in response.json()["documents"]]
        return out

    return sample


def audit_pair(
    pair: Pair,
    epsilon: float,
    samples: int,
    sampler: Sampler,
    loss: ExactLoss,
    confidence: float = 0.95,
) -> PairResult:
    d = sampler(pair.d, epsilon, samples)
    d2 = sampler(pair.d2, epsilon, samples)
    bound = lower_bound(d, d2, confidence, loss.events(pair, epsilon, samples))
    return PairResult(
        pair=pair.name,
        epsilon=epsilon,
        exact_epsilon=loss(pair, epsilon),
        lower_bound=bound.epsilon_lower,
        samples_per_side=samples,
        direction=bound.direction,
        event_size=len(bound.event),
    )


def write_report(results: list[PairResult], out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    lines = [
        "# sentdp audit",
        "",
        f"`{command}`",
        "",
        "| pair | declared ε | exact ε of the pair | empirical lower bound (95%) | samples/side "
        "| flagged |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.pair} | {r.epsilon:g} | {r.exact_epsilon:.3f} | {r.lower_bound:.3f} "
        f"| {r.samples_per_side} | {'**yes**' if r.flagged else 'no'} |"
        for r in results
    ]
    (out / "audit.md").write_text("\n".join(lines) + "\n")


def summary(results: list[PairResult]) -> dict[str, Any]:
    return {
        "pairs": len(results),
        "flagged": sum(r.flagged for r in results),
        "worst_margin": min((r.epsilon - r.lower_bound for r in results), default=0.0),
    }
