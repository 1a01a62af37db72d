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

import itertools
import json
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from evaluation.audit_stats import fit_pvalue, lower_bound, range_bound, ratio_bound
from sentdp.accounting import PURE, ZCDP, charge_for, epsilon_of_charge
from sentdp.bundle import Bundle
from sentdp.encoders import Encoder, recode
from sentdp.errors import InputError, SentDPError
from sentdp.text import SentenceSplitter, TextLimits, split_document

Document = list[str] | str
"""What the audit sends for one side of a pair: pre-split ``sentences`` or raw ``text``."""
Sampler = Callable[[Document, float, int], list[int]]
"""(document, epsilon, n) -> n released candidate ids."""

BATCH = 16
"""Documents per request (the service's default limit): each one is its own sample."""
ALPHA = 0.05 / 4
"""What each of the four events of a pair (two chosen on samples, two public) is tested at."""
FIT_ALPHA = 1e-4
"""A pair whose outcomes fit the bundle's distribution worse than this p-value is reported."""
RETRIES = 5
"""Tries of one request (the same Idempotency-Key each time)."""
PLANNER_GRID = tuple(250 << n for n in range(10))
"""Samples per side the planner tries: 250 to 128,000."""


@dataclass(frozen=True)
class Pair:
    """Neighbouring documents: ``d`` and ``d2`` are their privacy units (equal length, one
    position differs). ``texts``, when set, are the raw texts sent instead, whose segments
    under sentdp's splitter are ``d`` and ``d2``."""

    name: str
    d: list[str]
    d2: list[str]
    texts: tuple[str, str] | None = None
    endpoint: str = "privatize"
    """``privatize`` (outcome: the candidate id) or ``classify`` (outcome: the label)."""

    def inputs(self) -> tuple[Document, Document]:
        return self.texts if self.texts is not None else (self.d, self.d2)


@dataclass(frozen=True)
class PairResult:
    pair: str
    epsilon: float
    exact_epsilon: float
    lower_bound: float
    samples_per_side: int
    direction: str
    event_size: int
    form: str = "sentences"
    sentences: int = 0
    planned_samples: int | None = None
    """Samples per side at which the bound expected from the exact probabilities first
    reaches half the pair's exact loss (None: not within the planner's range)."""
    fit_pvalue: float = 1.0
    """Chi-square p-value (both sides, Bonferroni) of the outcomes against the bundle's exact
    distribution: tiny when the deployment does not run the mechanism it claims."""
    exact_range: float | None = None
    """For a zCDP tenant: the pair's exact privacy-loss range (``max_o L(o) - min_o L(o)``)
    under the draw the tenant should get, which must stay within epsilon."""
    range_lower_bound: float | None = None
    """For a zCDP tenant: the empirical lower bound on that range (the deployment's draw)."""

    @property
    def misfit(self) -> bool:
        return self.fit_pvalue < FIT_ALPHA

    @property
    def flagged(self) -> bool:
        """The loss, or for a zCDP tenant its range, provably above epsilon."""
        if self.range_lower_bound is not None and self.range_lower_bound > self.epsilon:
            return True
        return self.lower_bound > self.epsilon


class ExactLoss:
    """The exact privacy loss of a pair under a bundle, from the mechanism's probabilities."""

    def __init__(self, bundle: Bundle, encoder: Encoder, bounded_range: bool = False) -> None:
        self.bundle = bundle
        self.encoder = encoder
        self.bounded_range = bounded_range
        """The audited tenant accounts in zCDP: its votes are drawn by the exponential
        mechanism (:mod:`service.charging`), not by the vote's own rule."""
        self._known: dict[tuple[tuple[str, ...], float, str], np.ndarray] = {}

    def log_probs(
        self, sentences: list[str], epsilon: float, endpoint: str = "privatize"
    ) -> np.ndarray:
        """Exact log-probabilities of every outcome: each candidate of /privatize, or each
        label of /classify (cached: the pair search, the loss and the public events all ask
        for the same documents)."""
        key = (tuple(sentences), epsilon, endpoint)
        if key not in self._known:
            self._known[key] = self._log_probs(sentences, epsilon, endpoint)
        return self._known[key]

    def _log_probs(self, sentences: list[str], epsilon: float, endpoint: str) -> np.ndarray:
        choice = self.bundle.manifest.choice_for(epsilon)
        run_at = epsilon_of_charge(charge_for(epsilon))
        embedded = self.encoder.encode(sentences)
        if endpoint == "classify" and choice.label == "vote":
            # the vote the p table names for the request's epsilon, as the gateway sends it
            vote = self.bundle.vote_for(epsilon)
            return vote.log_probs(
                embedded,
                run_at,
                sentences,
                bounded_range=self.bounded_range,
                table_sentences=choice.vote_table,
            )
        variant = self.bundle.variant(choice.variant)
        recoded = recode(variant.recoder, embedded)
        if choice.radius is not None:  # the clipped-mean rule, at the p table's radius
            log_probs = variant.mean_mechanism(choice.radius).log_probs(recoded, run_at)
        else:
            log_probs = variant.mechanism().log_probs(recoded, run_at, choice.p)
        if endpoint == "privatize":
            return log_probs
        by_label = np.bincount(
            variant.candidate_labels(), np.exp(log_probs), len(self.bundle.labels)
        )  # a candidate's label is post-processing: its class's probabilities add up
        with np.errstate(divide="ignore"):
            return np.log(by_label)

    def __call__(self, pair: Pair, epsilon: float) -> float:
        return float(np.max(np.abs(self._losses(pair, epsilon))))

    def loss_range(self, pair: Pair, epsilon: float) -> float:
        """The pair's exact privacy-loss range ``max_o L(o) - min_o L(o)`` over the outcomes
        either side can draw (zCDP charges rho = epsilon**2 / 8 only where it is <= epsilon);
        infinite where one side can draw an outcome the other cannot."""
        losses = self._losses(pair, epsilon)
        return float(losses.max() - losses.min())

    def _losses(self, pair: Pair, epsilon: float) -> np.ndarray:
        """``L(o) = ln P_D(o) - ln P_D'(o)`` for every outcome either side can draw."""
        a, b = self._pair(pair, epsilon)
        possible = np.isfinite(a) | np.isfinite(b)  # a label no candidate has: never drawn
        losses: np.ndarray = a[possible] - b[possible]
        return losses

    def _pair(self, pair: Pair, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        return (
            self.log_probs(pair.d, epsilon, pair.endpoint),
            self.log_probs(pair.d2, epsilon, pair.endpoint),
        )

    def events(self, pair: Pair, epsilon: float, samples: int) -> tuple[set[int], set[int]]:
        """Output events chosen from the public bundle alone: (raised, lowered), the outcomes
        whose exact probability D raises most over D', and those D' raises most over D, as
        many as maximise the bound expected from ``samples`` draws per side (global
        candidate ids)."""
        offset = self.offset(epsilon, pair.endpoint)
        raised, lowered = (
            {offset + int(o) for o in event}
            for event, _ in self._best_events(pair, epsilon, samples)
        )
        return raised, lowered

    def expected_bound(self, pair: Pair, epsilon: float, samples: int) -> float:
        """The lower bound the audit should reach with ``samples`` draws per side, if every
        event were hit exactly as often as its exact probability says."""
        return max(expected for _, expected in self._best_events(pair, epsilon, samples))

    def planned_samples(self, pair: Pair, epsilon: float) -> int | None:
        """The fewest samples per side (from a doubling grid) at which the expected bound
        reaches half the pair's exact loss; None for a pair that leaks (nearly) nothing."""
        exact = self(pair, epsilon)
        if exact < 0.01:
            return None
        for samples in PLANNER_GRID:
            if self.expected_bound(pair, epsilon, samples) >= exact / 2:
                return samples
        return None

    def _best_events(
        self, pair: Pair, epsilon: float, samples: int
    ) -> list[tuple[np.ndarray, float]]:
        a, b = self._pair(pair, epsilon)
        chosen = []
        for first, second in ((a, b), (b, a)):
            order = np.argsort(-(first - second), kind="stable")[:256]
            p, q = np.cumsum(np.exp(first[order])), np.cumsum(np.exp(second[order]))
            expected = [
                ratio_bound(int(p[k] * samples), int(q[k] * samples), samples, samples, ALPHA)
                for k in range(len(order))
            ]
            size = int(np.argmax(expected)) + 1
            chosen.append((order[:size], float(max(expected))))
        return chosen

    def fit(self, pair: Pair, epsilon: float, d: list[int], d2: list[int]) -> float:
        """p-value of both sides' outcomes against their exact distributions (Bonferroni)."""
        offset = self.offset(epsilon, pair.endpoint)
        values = []
        for sentences, outcomes in ((pair.d, d), (pair.d2, d2)):
            probabilities = np.exp(self.log_probs(sentences, epsilon, pair.endpoint))
            local = [o - offset for o in outcomes]
            if any(not 0 <= o < len(probabilities) for o in local):
                return 0.0  # a candidate the chosen variant does not hold
            values.append(fit_pvalue(local, probabilities))
        return min(1.0, 2 * min(values))

    def offset(self, epsilon: float, endpoint: str = "privatize") -> int:
        """Global id of the variant's first candidate (the service releases global ids); 0
        for labels."""
        if endpoint == "classify":
            return 0
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


ABBREVIATED = (
    "Mr. J. R. Smith of the U.S. Dept. of Commerce met Gen. Lee at 10 a.m. on Jan. 5 in St. Paul.",
    "Dr. A. B. Jones and Prof. C. D. Brown of Acme Corp. and Widget Inc. agreed on Feb. 2 "
    "vs. the U.K. plan.",
)
"""Replacement segments full of abbreviations and initials: one unit each for sentdp's
splitter, many "sentences" for a splitter that cuts at every period."""


def _documents(texts: Sequence[str]) -> list[list[str]]:
    splitter, limits = SentenceSplitter(), TextLimits()
    documents = [split_document(t, splitter, limits) for t in texts]
    return [d for d in documents if 3 <= len(d) <= 12]


def _replaced(base: list[str], j: int, replacement: str) -> list[str]:
    return [*base[:j], replacement, *base[j + 1 :]]


def _most_moving(
    base: list[str],
    j: int,
    pool: Sequence[str],
    loss: ExactLoss,
    epsilon: float,
    endpoint: str = "privatize",
) -> str:
    def moved(replacement: str) -> float:
        return loss(Pair("", base, _replaced(base, j, replacement), endpoint=endpoint), epsilon)

    return max(pool, key=moved)


def adversarial_pairs(
    texts: Sequence[str],
    loss: ExactLoss,
    epsilon: float,
    count: int,
    seed: int = 0,
    endpoint: str = "privatize",
) -> list[Pair]:
    """Pairs from public documents whose replacement moves the output most (by exact loss),
    plus a one-sentence and a many-sentence document. ``endpoint="classify"`` audits the
    label /classify releases instead of /privatize's candidate."""
    rng = random.Random(seed)  # noqa: S311 - choosing public documents, not privacy
    documents = _documents(texts)
    pool = [*OUTLIERS, *(rng.choice(d) for d in rng.sample(documents, 24))]
    prefix = "label-" if endpoint == "classify" else ""
    pairs = []
    for n, base in enumerate(rng.sample(documents, count)):
        j = rng.randrange(len(base))
        best = _most_moving(base, j, pool, loss, epsilon, endpoint)
        pairs.append(Pair(f"{prefix}doc{n}-s{j}", base, _replaced(base, j, best), None, endpoint))
    one = rng.choice(documents)[:1]
    pairs.append(Pair(f"{prefix}one-sentence", one, [OUTLIERS[0]], None, endpoint))
    many = [s for d in rng.sample(documents, 4) for s in d][:40]
    pairs.append(Pair(f"{prefix}many-sentences", many, [*many[:-1], OUTLIERS[1]], None, endpoint))
    return pairs


def text_pairs(
    texts: Sequence[str], loss: ExactLoss, epsilon: float, count: int, seed: int = 1
) -> list[Pair]:
    """Raw-text pairs: one segment of a public document replaced by the abbreviation-laden
    segment that moves the output most. Sent as ``text``, so the deployment's splitter is
    part of what is audited; each pair is checked to be neighbours under sentdp's splitter."""
    rng = random.Random(seed)  # noqa: S311 - choosing public documents, not privacy
    splitter, limits = SentenceSplitter(), TextLimits()
    pairs: list[Pair] = []
    for base in rng.sample(_documents(texts), 4 * count):
        j = rng.randrange(len(base) - 1)  # not the last segment: its end needs no mark
        other = _replaced(base, j, _most_moving(base, j, ABBREVIATED, loss, epsilon))
        raw, raw2 = _as_text(base), _as_text(other)
        if split_document(raw, splitter, limits) == base and (
            split_document(raw2, splitter, limits) == other
        ):
            pairs.append(Pair(f"text{len(pairs)}-s{j}", base, other, (raw, raw2)))
        if len(pairs) == count:
            break
    return pairs


def _as_text(segments: list[str]) -> str:
    """Segments as one text: after a sentence-final mark a space, otherwise (a headline) a
    blank line, which ends a paragraph."""
    text = segments[0]
    for before, segment in itertools.pairwise(segments):
        text += (" " if re.search(r"[.!?][\"')\]]*$", before) else "\n\n") + segment
    return text


def tenant_accounting(url: str, key: str) -> str:
    """The audited key's accountant ("pure" or "zcdp"), from ``/budget`` (which charges
    nothing): it decides how the deployment draws that tenant's votes."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:  # as the sampler
        try:
            reply = http.post("/budget", json={"user": "audit-accounting"})
        except UnicodeError:  # the first request: a host name IDNA refuses (a long label)
            raise InputError("the --url's host name is not a valid one") from None
    reply.raise_for_status()
    try:
        accounting = reply.json()["accounting"]
    except (ValueError, RecursionError, KeyError, TypeError):  # not JSON, or not the answer
        raise UnexpectedAnswerError("/budget answered without an accountant") from None
    if accounting not in ACCOUNTANTS:
        raise UnexpectedAnswerError(
            f"/budget named the accountant {str(accounting)[:40]!r}, not one of {ACCOUNTANTS}"
        )
    return str(accounting)


ACCOUNTANTS = (PURE, ZCDP)


class UnexpectedAnswerError(SentDPError):
    """The deployment answered 2xx with something that is not sentdp's answer (another
    service at the URL, a proxy's page, a version that answers otherwise): the audit stops
    rather than scoring samples it did not get."""


def candidate_id(value: object) -> int:
    """A candidate's index as the answer gives it: a JSON integer, never below 0 (``int()``
    would take 3.7, "3" or true, and a negative index would count as a real candidate)."""
    if type(value) is not int or value < 0:
        raise TypeError("a candidate is a non-negative integer")
    return value


def retry_after(header: str | None) -> float:
    """Seconds to wait before a retry: the Retry-After header's seconds, kept within [0, 60];
    1 when it is absent or not a number (an HTTP date, say)."""
    try:
        seconds = float(header) if header is not None else 1.0
    except ValueError:
        return 1.0
    return min(max(seconds, 0.0), 60.0) if math.isfinite(seconds) else 1.0


def http_sampler(
    url: str,
    key: str,
    batch: int = BATCH,
    concurrency: int = 16,
    progress: Callable[[int], None] | None = None,
    labels: Sequence[str] | None = None,
) -> Sampler:
    """Samples from a live server: ``/privatize`` (or, given the bundle's ``labels``,
    ``/classify``, whose outcome is the label's index) with up to ``batch`` copies of the
    document per request, ``concurrency`` requests in flight, a fresh Idempotency-Key and
    user per request (retried with the same key on a transport error, 429 or 503, as a client
    should); each response document is one sample."""
    path = "/privatize" if labels is None else "/classify"
    label_index = {label: n for n, label in enumerate(labels or ())}
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def one(http: httpx.Client, document: Document, epsilon: float, size: int) -> list[int]:
        form = "text" if isinstance(document, str) else "sentences"
        body = {
            "user": f"audit-{uuid.uuid4().hex[:12]}",
            "epsilon": epsilon,
            "documents": [{form: document}] * size,
        }
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        for attempt in range(RETRIES):
            try:
                response = http.post(path, json=body, headers=headers)
            except httpx.TransportError:
                if attempt == RETRIES - 1:
                    raise
                continue
            if response.status_code not in (429, 503) or attempt == RETRIES - 1:
                break
            time.sleep(retry_after(response.headers.get("Retry-After")))
        response.raise_for_status()
        try:
            documents = response.json()["documents"]
            drawn = [
                label_index[d["label"]] if labels is not None else candidate_id(d["candidate"])
                for d in documents
            ]
        except (ValueError, RecursionError, httpx.DecodingError, KeyError, TypeError):
            raise UnexpectedAnswerError(f"{path} answered without a sample per document") from None
        if len(drawn) != size:
            raise UnexpectedAnswerError(
                f"{path} answered {len(drawn)} documents for the {size} it was sent"
            )
        if progress is not None:
            progress(len(drawn))
        return drawn

    def sample(document: Document, epsilon: float, n: int) -> list[int]:
        sizes = [min(batch, n - done) for done in range(0, n, batch)]
        headers = {"Authorization": f"Bearer {key}"}
        with (
            httpx.Client(base_url=url, headers=headers, timeout=300) as http,
            ThreadPoolExecutor(concurrency) as pool,
        ):
            parts = pool.map(lambda size: one(http, document, epsilon, size), sizes)
            return [c for part in parts for c in part]

    return sample


def audit_pair(
    pair: Pair,
    epsilon: float,
    samples: int,
    sampler: Sampler,
    loss: ExactLoss,
    confidence: float = 0.95,
) -> PairResult:
    first, second = pair.inputs()
    d = sampler(first, epsilon, samples)
    d2 = sampler(second, epsilon, samples)
    raised, lowered = loss.events(pair, epsilon, samples)
    spread: dict[str, float] = {}
    if loss.bounded_range:  # a zCDP tenant: its loss range is tested too, at half the error
        confidence = 1 - (1 - confidence) / 2
        spread = {
            "exact_range": loss.loss_range(pair, epsilon),
            "range_lower_bound": range_bound(d, d2, raised, lowered, confidence),
        }
    bound = lower_bound(d, d2, confidence, [raised], [lowered])
    return PairResult(
        pair=pair.name,
        epsilon=epsilon,
        exact_epsilon=loss(pair, epsilon),
        lower_bound=bound.epsilon_lower,
        samples_per_side=samples,
        direction=bound.direction,
        event_size=len(bound.event),
        form=("text" if pair.texts is not None else "sentences")
        + (" → label" if pair.endpoint == "classify" else ""),
        sentences=len(pair.d),
        planned_samples=loss.planned_samples(pair, epsilon),
        fit_pvalue=loss.fit(pair, epsilon, d, d2),
        **spread,
    )


@dataclass(frozen=True)
class RunInfo:
    """How one audit ran: for the report's header and its cost table."""

    command: str
    deployment: str
    seconds: float
    documents: int
    confidence: float | None = None
    """With which all the bounds of the run hold together (None: each pair's alone, at 95%)."""


def _confidence(run: RunInfo, results: list[PairResult]) -> str:
    if run.confidence is None:
        return "Each bound holds with 95% confidence on its own."
    return (
        f"The bounds of all {len(results)} pairs (a zCDP tenant's pair has two: its loss and "
        f"its loss range) hold together with {run.confidence:.0%} confidence (Bonferroni)."
    )


def _range_cell(result: PairResult) -> str:
    if result.range_lower_bound is None or result.exact_range is None:
        return "-"
    return f"{result.exact_range:.3f} / {result.range_lower_bound:.3f}"


def write_report(results: list[PairResult], out: Path, run: RunInfo) -> None:
    out.mkdir(parents=True, exist_ok=True)
    body = {"run": asdict(run), "pairs": [asdict(r) for r in results]}
    (out / "audit.json").write_text(json.dumps(body, indent=2) + "\n")
    rate = run.documents / run.seconds if run.seconds else 0.0
    lines = [
        "# sentdp audit",
        "",
        f"`{run.command}`",
        "",
        f"Deployment: {run.deployment}. {run.documents:,} privatized documents in "
        f"{run.seconds / 60:.1f} min ({rate:.0f} documents/s). {_confidence(run, results)}",
        "",
        "| pair | input | k | declared ε | exact ε of the pair | empirical lower bound "
        "| samples/side | samples/side for half the exact ε (planned) | fit to the bundle (χ² p) "
        "| loss range, exact / lower bound (zCDP: ≤ ε) | flagged |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.pair} | {r.form} | {r.sentences} | {r.epsilon:g} | {r.exact_epsilon:.3f} "
        f"| {r.lower_bound:.3f} | {r.samples_per_side:,} "
        f"| {'-' if r.planned_samples is None else f'{r.planned_samples:,}'} "
        f"| {r.fit_pvalue:.3g}{' **misfit**' if r.misfit else ''} "
        f"| {_range_cell(r)} | {'**yes**' if r.flagged else 'no'} |"
        for r in results
    ]
    (out / "audit.md").write_text("\n".join(lines) + "\n")
