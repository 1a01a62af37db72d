"""The audit on real bundles: honest services pass, broken ones are flagged.

Mutants run two ways: in this process (fast, exact control over the mechanism), and as real
``bentoml serve`` servers whose code is broken by ``tests/mutants/sitecustomize.py``, audited
over HTTP exactly as ``sentdp-audit`` audits a deployment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from evaluation.audit import (
    ABBREVIATED,
    Document,
    ExactLoss,
    Pair,
    RunInfo,
    adversarial_pairs,
    audit_pair,
    http_sampler,
    tenant_accounting,
    text_pairs,
    write_report,
)
from sentdp.accounting import charge_for, epsilon_of_charge
from sentdp.encoders import recode
from sentdp.text import SentenceSplitter, TextLimits, split_document
from tests.support import TENANTS, Server, write_tenants

pytestmark = pytest.mark.slow
MUTANTS = Path(__file__).resolve().parent.parent / "mutants"


@pytest.fixture(scope="module")
def loss(quick_bundle_tag: str, encoder) -> ExactLoss:  # type: ignore[no-untyped-def]
    from training.store import load_from_store

    return ExactLoss(load_from_store(quick_bundle_tag), encoder)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    from training.datasets import bbc_news_texts

    return [text for _, _, text in bbc_news_texts(Path(os.environ["SENTDP_CACHE_DIR"]))][:400]


def in_process(loss: ExactLoss, scale: float = 1.0, cached: bool = False, seed: int = 0):  # type: ignore[no-untyped-def]
    """A sampler running the bundle's mechanism in this process; the mutants live here only:
    ``scale`` multiplies epsilon (sensitivity mis-scaled), ``cached`` returns one fixed
    output per document (a content cache). Its draws come from one generator seeded with
    ``seed``, so a run is reproducible and each call's draws are independent of the last."""
    generator = np.random.default_rng(seed)

    def sample(document: Document, epsilon: float, n: int) -> list[int]:
        sentences = (
            split_document(document, SentenceSplitter(), TextLimits())
            if isinstance(document, str)
            else document
        )
        bundle = loss.bundle
        choice = bundle.manifest.choice_for(epsilon)
        variant = bundle.variant(choice.variant)
        recoded = recode(variant.recoder, loss.encoder.encode(sentences))
        run_at = epsilon_of_charge(charge_for(epsilon)) * scale
        # a content cache: the same sentences, the same draw (sha256, not hash(), so that
        # every run of this test sees the same draws: hash() of text changes from run to run)
        key = hashlib.sha256("\x00".join(sentences).encode()).digest()
        rng = np.random.default_rng(int.from_bytes(key[:8])) if cached else generator
        drawn = variant.mechanism().sample_batch(
            [recoded] * (1 if cached else n), [run_at] * (1 if cached else n), None, rng
        )
        return [variant.record.offset + int(c) for c in drawn] * (n if cached else 1)

    return sample


def test_honest_mechanisms_pass_and_mutants_are_flagged(loss: ExactLoss, texts: list[str]) -> None:
    pairs = adversarial_pairs(texts, loss, 1.0, 2)
    for pair in pairs[:2]:
        honest = audit_pair(pair, 1.0, 4000, in_process(loss), loss, confidence=0.999)
        assert honest.exact_epsilon <= 1.0
        assert not honest.flagged, honest
    # 4,000 draws a side: with 1,500 the epsilon x6 mutant's bound on the quick bundle's two
    # adversarial pairs fell below 1 together in about one run in twenty (1.14-1.73 over six
    # runs of each, one at 0.70); with 4,000 it was 1.44-2.06 over six.
    flagged = {
        name: any(
            audit_pair(pair, 1.0, 4000, sampler, loss, 0.999).flagged
            for pair in [*pairs[:2], pairs[-1]]
        )
        for name, sampler in (
            ("epsilon x6", in_process(loss, scale=6.0)),
            ("content cache", in_process(loss, cached=True)),
        )
    }
    assert flagged == {"epsilon x6": True, "content cache": True}


def test_text_pairs_are_neighbours_under_sentdp_s_splitter(
    loss: ExactLoss, texts: list[str]
) -> None:
    pairs = text_pairs(texts, loss, 1.0, 3)
    assert len(pairs) == 3
    splitter = SentenceSplitter()
    for pair in pairs:
        assert pair.texts is not None
        d, d2 = (split_document(t, splitter, TextLimits()) for t in pair.texts)
        assert (d, d2) == (pair.d, pair.d2)
        changed = [j for j, (a, b) in enumerate(zip(d, d2, strict=True)) if a != b]
        assert len(changed) == 1
        assert d2[changed[0]] in ABBREVIATED


def test_the_planner_asks_more_samples_of_a_weaker_pair(loss: ExactLoss, texts: list[str]) -> None:
    pair = adversarial_pairs(texts, loss, 1.0, 1)[0]
    bounds = [loss.expected_bound(pair, 1.0, n) for n in (250, 2000, 16000)]
    assert bounds == sorted(bounds)
    assert bounds[-1] > bounds[0]
    assert bounds[-1] <= loss(pair, 1.0)  # an expected bound never exceeds the exact loss
    one = next(p for p in adversarial_pairs(texts, loss, 1.0, 1) if p.name == "one-sentence")
    assert loss(one, 1.0) < 0.01
    assert loss.planned_samples(one, 1.0) is None


def test_the_audit_uses_the_mean_rule_where_the_p_table_names_it(
    mean_bundle_tag: str, loss: ExactLoss, texts: list[str]
) -> None:
    """At the epsilon the p table draws by the clipped mean, the exact loss is that rule's
    (not Tukey depth's), and on real adversarial pairs it stays within epsilon."""
    from training.store import load_from_store

    mean_loss = ExactLoss(load_from_store(mean_bundle_tag), loss.encoder)
    choice = mean_loss.bundle.manifest.p_table[-1]
    assert choice.selection == "mean"
    assert choice.radius is not None
    epsilon = choice.epsilon
    sentences = split_document(texts[0], SentenceSplitter(), TextLimits())
    variant = mean_loss.bundle.variant(choice.variant)
    recoded = recode(variant.recoder, loss.encoder.encode(sentences))
    run_at = epsilon_of_charge(charge_for(epsilon))
    expected = variant.mean_mechanism(choice.radius).log_probs(recoded, run_at)
    np.testing.assert_array_equal(mean_loss.log_probs(sentences, epsilon), expected)
    assert not np.array_equal(loss.log_probs(sentences, epsilon), expected)
    for pair in adversarial_pairs(texts, mean_loss, epsilon, 2)[:3]:
        assert 0 < mean_loss(pair, epsilon) <= epsilon


def vote_sampler(loss: ExactLoss, bounded_range: bool, seed: int = 0):  # type: ignore[no-untyped-def]
    """/classify in this process: labels drawn from the vote's exact distribution, by the
    bounded-range exponential mechanism or by the vote's own rule."""
    generator = np.random.default_rng(seed)

    def sample(document: Document, epsilon: float, n: int) -> list[int]:
        assert not isinstance(document, str)
        vote = loss.bundle.vote_for(epsilon)
        run_at = epsilon_of_charge(charge_for(epsilon))
        log_probs = vote.log_probs(
            loss.encoder.encode(document), run_at, document, bounded_range=bounded_range
        )
        probabilities = np.exp(log_probs)
        return [int(o) for o in generator.choice(len(probabilities), n, p=probabilities)]

    return sample


def test_a_zcdp_audit_flags_a_vote_draw_whose_loss_range_exceeds_epsilon(
    loss: ExactLoss,
) -> None:
    """rho = epsilon**2 / 8 needs the loss range within epsilon: a deployment that drew a
    zCDP tenant's votes by the vote's own rule (one sentence: range about 2 epsilon) is
    flagged by the range although no single outcome's loss exceeds epsilon."""
    assert loss.bundle.manifest.choice_for(1.0).label == "vote"
    # the quick bundle's votes as simplex votes drawn by count, whatever shape validation
    # chose: the count rule is the one whose range reaches 2 epsilon on one sentence
    votes = tuple(vote.shaped("simplex").counted() for vote in loss.bundle.votes)
    manifest = loss.bundle.manifest.model_copy(
        update={"vote_shapes": None, "vote_by_count": True, "format_version": 7}
    )
    counted = dataclasses.replace(loss.bundle, manifest=manifest, votes=votes)
    loss = ExactLoss(counted, loss.encoder)
    zcdp = ExactLoss(counted, loss.encoder, bounded_range=True)
    pair = Pair(
        "label-one-sentence",
        ["The striker scored twice in the second half."],
        ["Shares in the bank fell sharply on Monday."],
        endpoint="classify",
    )
    honest = audit_pair(pair, 1.0, 4000, vote_sampler(zcdp, True), zcdp, confidence=0.999)
    assert honest.exact_range is not None
    assert honest.exact_range <= 1.0
    assert honest.exact_range > 0.99  # the pair reaches the range: the test has power
    assert honest.range_lower_bound is not None
    assert 0 < honest.range_lower_bound < 1.0
    assert not honest.flagged, honest

    regressed = audit_pair(pair, 1.0, 4000, vote_sampler(zcdp, False), zcdp, confidence=0.999)
    assert regressed.lower_bound <= 1.0  # no outcome's loss is provably above epsilon ...
    assert regressed.range_lower_bound is not None
    assert regressed.range_lower_bound > 1.0
    assert regressed.flagged  # ... but the range is
    assert regressed.misfit  # and the draws do not follow the bounded-range distribution

    pure = audit_pair(pair, 1.0, 4000, vote_sampler(loss, False), loss, confidence=0.999)
    assert pure.range_lower_bound is None
    assert pure.exact_range is None
    assert not pure.flagged  # a pure tenant's own rule is epsilon-DP: nothing to flag


@pytest.fixture(scope="module")
def audit_server_env(quick_bundle_tag: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("audit")
    return {
        "SENTDP_MODEL": quick_bundle_tag,
        "SENTDP_TENANTS_FILE": str(write_tenants(folder / "tenants.json")),
        "SENTDP_MAX_DOCUMENTS": "16",
    }, folder


def _serve(env: dict[str, str], folder: Path, name: str, mutant: str = "") -> Server:
    extra = {"SENTDP_LEDGER_URL": f"sqlite:///{folder / f'{name}.sqlite3'}"}
    if mutant:
        path = os.environ.get("PYTHONPATH", "")
        extra |= {
            "SENTDP_TEST_MUTANT": mutant,
            "PYTHONPATH": f"{MUTANTS}{os.pathsep}{path}" if path else str(MUTANTS),
        }
    return Server({**env, **extra}, log=folder / f"{name}.log").start()


@pytest.fixture(scope="module", params=["epsilon-doubled", "fixed-randomness", "naive-splitter"])
def mutant_server(request: pytest.FixtureRequest, audit_server_env) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    env, folder = audit_server_env
    server = _serve(env, folder, request.param, request.param)
    yield server
    server.stop()


MUTANT_AUDIT = {
    # declared epsilon, samples per side, pairs: each flagged with these queries (see note)
    "epsilon-doubled": (3.0, 1600, "sentences"),
    "fixed-randomness": (1.0, 160, "sentences"),
    # 3,200 left one pair of two unflagged 38-53% of the time: the test failed up to 2.2e-4
    # of runs; 4,800 bring that under 1e-6 (an estimate from the exact distributions)
    "naive-splitter": (2.0, 4800, "text"),
}


@pytest.mark.server
def test_a_live_audit_flags_every_mutant_server(
    mutant_server: Server, loss: ExactLoss, texts: list[str], tmp_path: Path
) -> None:
    mutant = mutant_server.env["SENTDP_TEST_MUTANT"]
    epsilon, samples, form = MUTANT_AUDIT[mutant]
    pairs = (
        text_pairs(texts, loss, epsilon, 2)
        if form == "text"
        else adversarial_pairs(texts, loss, epsilon, 2)[:2]
    )
    sampler = http_sampler(mutant_server.url, TENANTS[0].key, batch=16)
    results = [audit_pair(pair, epsilon, samples, sampler, loss) for pair in pairs]
    assert all(r.exact_epsilon <= epsilon for r in results)  # the honest bundle's exact loss
    assert any(r.flagged for r in results), results
    write_report(results, tmp_path, RunInfo("test", mutant, 1.0, 4 * samples))
    assert "**yes**" in (tmp_path / "audit.md").read_text()


@pytest.mark.server
def test_a_live_audit_of_the_honest_server_flags_nothing(
    audit_server_env, loss: ExactLoss, texts: list[str], tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    env, folder = audit_server_env
    # The quick bundle takes /classify's label from SentenceVote at epsilon 1, so the label
    # pair below audits the real worker's vote path.
    assert loss.bundle.manifest.choice_for(1.0).label == "vote"
    server = _serve(env, folder, "honest")
    labels = loss.bundle.labels
    try:
        # the audit models the tenant's draw: a pure-epsilon tenant gets the vote's own rule
        assert tenant_accounting(server.url, TENANTS[0].key) == "pure"
        samplers = {
            "privatize": http_sampler(server.url, TENANTS[0].key, batch=16),
            "classify": http_sampler(server.url, TENANTS[0].key, batch=16, labels=labels),
        }
        pairs = [
            *adversarial_pairs(texts, loss, 1.0, 1)[:1],
            *text_pairs(texts, loss, 1.0, 1),
            *adversarial_pairs(texts, loss, 1.0, 1, endpoint="classify")[:1],
        ]
        results = [
            audit_pair(pair, 1.0, 1600, samplers[pair.endpoint], loss, confidence=0.999)
            for pair in pairs
        ]
    finally:
        server.stop()
    assert [r.form for r in results] == ["sentences", "text", "sentences → label"]
    assert all(r.exact_epsilon <= 1.0 for r in results)
    assert not any(r.flagged for r in results), results
    # the server draws what the bundle says; not at the report's 1e-4, which three pairs
    # (one of 5 sparse label cells) would miss in about 5e-4 of honest runs
    assert min(r.fit_pvalue for r in results) > 1e-8
    write_report(results, tmp_path, RunInfo("sentdp-audit (test)", "honest", 1.0, 9600))
    assert "| text0" in (tmp_path / "audit.md").read_text()
