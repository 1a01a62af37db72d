"""The audit on real bundles: honest mechanisms pass, broken ones are flagged; a live run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from evaluation.audit import ExactLoss, adversarial_pairs, audit_pair, http_sampler, write_report
from sentdp.accounting import charge_for, epsilon_of_charge
from sentdp.encoders import recode

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loss(quick_bundle_tag: str, encoder) -> ExactLoss:  # type: ignore[no-untyped-def]
    from training.store import load_from_store

    return ExactLoss(load_from_store(quick_bundle_tag), encoder)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    from training.datasets import bbc_news_texts

    return [text for _, _, text in bbc_news_texts(Path(os.environ["SENTDP_CACHE_DIR"]))][:400]


def in_process(loss: ExactLoss, scale: float = 1.0, cached: bool = False):  # type: ignore[no-untyped-def]
    """A sampler running the bundle's mechanism in this process; the mutants live here only:
    ``scale`` multiplies epsilon (sensitivity mis-scaled), ``cached`` returns one fixed
    output per document (a content cache)."""

    def sample(sentences: list[str], epsilon: float, n: int) -> list[int]:
        bundle = loss.bundle
        choice = bundle.manifest.choice_for(epsilon)
        variant = bundle.variant(choice.variant)
        recoded = recode(variant.recoder, loss.encoder.encode(sentences))
        run_at = epsilon_of_charge(charge_for(epsilon)) * scale
        rng = np.random.default_rng(abs(hash(tuple(sentences))) % 2**32 if cached else None)
        drawn = variant.mechanism().sample_batch(
            [recoded] * (1 if cached else n), [run_at] * (1 if cached else n), None, rng
        )
        return [variant.record.offset + int(c) for c in drawn] * (n if cached else 1)

    return sample


def test_honest_mechanisms_pass_and_mutants_are_flagged(loss: ExactLoss, texts: list[str]) -> None:
    pairs = adversarial_pairs(texts, loss, 1.0, 2)
    for pair in pairs[:2]:
        honest = audit_pair(pair, 1.0, 1500, in_process(loss), loss, confidence=0.999)
        assert honest.exact_epsilon <= 1.0
        assert not honest.flagged, honest
    flagged = {
        name: any(
            audit_pair(pair, 1.0, 1500, sampler, loss, 0.999).flagged
            for pair in [*pairs[:2], pairs[-1]]
        )
        for name, sampler in (
            ("epsilon x6", in_process(loss, scale=6.0)),
            ("content cache", in_process(loss, cached=True)),
        )
    }
    assert flagged == {"epsilon x6": True, "content cache": True}


@pytest.mark.server
def test_a_small_live_audit_of_the_real_server(
    server, loss: ExactLoss, texts, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from tests.support import TENANTS

    sampler = http_sampler(server.url, TENANTS[0].key, batch=4)
    results = [
        audit_pair(pair, 1.0, 160, sampler, loss, confidence=0.999)
        for pair in adversarial_pairs(texts, loss, 1.0, 1)[:2]
    ]
    assert all(r.exact_epsilon <= 1.0 for r in results)
    assert not any(r.flagged for r in results), results
    write_report(results, tmp_path, "sentdp-audit (test)")
    assert "| doc0" in (tmp_path / "audit.md").read_text()
