"""A small in-memory bundle and a fake worker for the charging flow's unit tests.

The bundle is a real :class:`sentdp.bundle.Bundle` with random public values; the fake worker
runs the real mechanism of that bundle on pseudo-embeddings (one vector per sentence, from a
hash of the sentence alone) and journals every charge id before drawing, as the real worker
does, so tests can check that nothing sampled is ever refunded.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sentdp.bundle import Bundle, BundleManifest, CorpusRecord, PChoice, Variant, VariantRecord
from sentdp.labels import SentenceVote
from sentdp.mechanism import DeepCandidate
from sentdp.words import TOKENIZER, WordFeatures
from service.charging import WorkerNotRunError, WorkerOutcomeUnknownError
from service.errors import Code
from service.schemas import BACKLOG_ERROR, LATE_ERROR, WorkRequest, WorkResult

DIM = 8
LABELS = ["business", "sport", "tech"]
WORDS = ("bank", "goal", "match", "phone", "profit", "shares", "software", "team")
"""The vocabulary of a tiny bundle's word-reading vote."""
RADIUS = 2.5
"""The clipping radius of a tiny bundle's mean rule (pseudo-embeddings have norms near 2.8)."""


def tiny_bundle(
    m: int = 40,
    p_max: int = 6,
    seed: int = 0,
    encoder_dir: Path = Path("/nonexistent"),
    vote: bool = False,
    labels: list[str] | None = None,
    second_vote: bool = False,
    words: bool = False,
    by_count: bool = False,
    mean: bool = False,
    cube: bool = False,
    table: int = 0,
) -> Bundle:
    """Two variants; with ``vote``, a SentenceVote that /classify uses at epsilon 1 (below 5);
    with ``second_vote`` too, two votes, the p table running vote 1 at epsilon 1; with
    ``words``, the last vote also reads its sentences' words (:data:`WORDS`); with
    ``by_count``, the votes are drawn by the sentence-count rule (format version 5); with
    ``mean``, epsilon 5 draws its candidate by the clipped-mean rule at :data:`RADIUS`
    (format version 6); with ``cube``, the last vote votes in the cube (format version 7);
    with ``table``, epsilon 1 draws documents of at most that many sentences from the
    hard-vote table (format version 8)."""
    if words and not vote:
        raise ValueError("a tiny bundle reads words only in a vote: pass vote=True too")
    rng = np.random.default_rng(seed)
    labels = labels or LABELS
    records = [
        VariantRecord(
            name=name,
            recipe="paper",
            dim=DIM,
            candidates=m,
            offset=n * m,
            p_max=p_max,
            directions_seed=seed,
            labels_from="test",
        )
        for n, name in enumerate(("paper", "label-8d"))
    ]
    variants = tuple(
        Variant(
            record=record,
            candidates=rng.normal(size=(m, DIM)),
            directions=rng.normal(size=(p_max, DIM)),
            candidate_class_probs=rng.dirichlet(np.ones(len(labels)), size=m),
            recoder=None,
        )
        for record in records
    )
    manifest = BundleManifest(
        format_version=(
            8
            if table
            else 7
            if cube
            else 6
            if mean
            else 5
            if by_count
            else 4
            if words
            else 3
            if second_vote
            else 1
        ),
        vote_words=TOKENIZER if words else None,
        vote_by_count=by_count,
        vote_shapes=(["simplex", "cube"] if second_vote else ["cube"]) if cube else None,
        name="sentdp-unit",
        recipe="mixed",
        created="2026-01-01T00:00:00+00:00",
        corpus=CorpusRecord(
            name="synthetic",
            sha256="0" * 64,
            source="tests",
            is_public=True,
            documents=m,
            split_seed=0,
            splits={"train": m},
            labels=labels,
        ),
        encoder={"name": "hash"},
        splitter={"name": "test"},
        variants=records,
        p_table=[
            PChoice(
                epsilon=1.0,
                variant="label-8d",
                p=3,
                label="vote" if vote else "candidate",
                vote_index=1 if second_vote else 0,
                vote_table=table,
            ),
            PChoice(epsilon=5.0, variant="paper", p=1, selection="mean", radius=RADIUS)
            if mean
            else PChoice(epsilon=5.0, variant="paper", p=6),
        ],
    )
    votes = [
        SentenceVote(rng.normal(size=(len(labels), DIM)), rng.normal(size=len(labels)))
        for _ in range(2 if second_vote else 1)
    ]
    if words:
        vocabulary = WordFeatures(WORDS, 1.0 + rng.random(len(WORDS)))
        word_weights = rng.normal(size=(len(labels), len(WORDS))) * 3
        votes[-1] = SentenceVote(votes[-1].weights, votes[-1].bias, word_weights, vocabulary)
    votes = [v.counted(by_count) for v in votes]
    if cube:
        votes[-1] = votes[-1].shaped("cube")
    return Bundle(manifest, variants, None, encoder_dir, tuple(votes) if vote else ())


def embed(sentence: str) -> np.ndarray:
    """A pseudo-embedding that depends on the sentence alone."""
    seed = int.from_bytes(hashlib.sha256(sentence.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=DIM)


@dataclass
class FakeWorker:
    """Runs the bundle's real mechanism; ``mode`` injects the failures of a real deployment.

    ``ok``; ``not_run`` (refused before dispatch); ``after`` (fails after sampling);
    ``partial`` (the first item fails before sampling, the others sample); ``backlog`` (late
    behind the tenant's own earlier requests: nothing drawn); ``partial_backlog`` (the first
    item as in ``backlog``, the others sample: a mix no real worker makes). Like the real
    worker, a request whose deadline has passed draws nothing.
    """

    bundle: Bundle
    mode: str = "ok"
    journal: list[int] = field(default_factory=list)
    calls: int = 0

    async def __call__(self, work: WorkRequest) -> list[WorkResult]:
        self.calls += 1
        if self.mode == "not_run":
            raise WorkerNotRunError("worker busy (cancelled before dispatch)")
        if self.mode == "backlog":
            return [WorkResult(sampled=False, error=BACKLOG_ERROR)] * len(work.items)
        if time.time() > work.deadline:
            return [WorkResult(sampled=False, error=LATE_ERROR)] * len(work.items)
        results: list[WorkResult] = []
        for n, item in enumerate(work.items):
            if self.mode in ("partial", "partial_backlog") and n == 0:
                error = BACKLOG_ERROR if self.mode == "partial_backlog" else "ValueError before"
                results.append(WorkResult(sampled=False, error=error))
                continue
            sentences = np.stack([embed(s) for s in item.sentences])
            if item.release == "vote":
                plan = self.bundle.votes[item.vote].plan_batch(
                    [sentences],
                    [item.epsilon],
                    texts=[item.sentences],
                    bounded_range=item.bounded_range,
                    table_sentences=item.vote_table,
                )
                self.journal.append(item.charge_id)
                results.append(
                    WorkResult(label=int(DeepCandidate.draw_plans(plan)[0]), sampled=True)
                )
                continue
            variant = self.bundle.variant(item.variant)
            if item.radius is not None:
                plan = variant.mean_mechanism(item.radius).plan_batch([sentences], [item.epsilon])
            else:
                mechanism = DeepCandidate(variant.candidates, variant.directions)
                plan = mechanism.plan_batch([sentences], [item.epsilon], [item.p])
            self.journal.append(item.charge_id)
            local = int(DeepCandidate.draw_plans(plan)[0])
            results.append(WorkResult(candidate=variant.record.offset + local, sampled=True))
        if self.mode == "after":
            raise WorkerOutcomeUnknownError(Code.MECHANISM_FAILED, "injected fault after sampling")
        return results
