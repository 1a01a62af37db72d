"""The selection comparison on a small real bundle: every rule scored on the same votes."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.vote_selection import compare, exponential_probs
from sentdp.labels import vote_log_probs
from training.store import load_from_store

pytestmark = pytest.mark.slow


def test_permute_and_flip_is_scored_against_the_exponential_mechanism_on_the_same_votes(
    quick_bundle_tag: str,
) -> None:
    bundle = load_from_store(quick_bundle_tag)
    rows = compare(bundle, [1.0, 3.0, 50.0])
    assert [(split, eps) for split, eps, *_ in rows] == [
        (split, eps) for split in ("validation", "test") for eps in (1.0, 3.0, 50.0)
    ]
    low = [(em, flip) for split, eps, em, flip, _ in rows if split == "validation" and eps <= 3]
    assert np.mean([flip for _, flip in low]) > np.mean([em for em, _ in low])
    for _, _, em, flip, by_count in rows:
        assert 0.0 <= em <= 1.0
        assert 0.0 <= flip <= 1.0
        # BBC News articles are longer than the rule's short documents (at most 3 sentences
        # at epsilon 1, 5 classes): by count they are drawn by permute-and-flip
        assert by_count == flip
    deviations = np.array([0, 64, 200, 10])  # at large epsilon both put nearly all on the leader
    assert np.exp(vote_log_probs(deviations, 200.0))[0] > 0.999
    assert exponential_probs(deviations, 200.0)[0] > 0.999
    assert abs(exponential_probs(deviations, 1.0).sum() - 1.0) < 1e-12
