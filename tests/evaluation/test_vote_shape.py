"""evaluation.vote_shape on a small real bundle: both shapes scored on the same documents, the
shape the bundle serves scored as it is drawn (cube votes themselves: tests/sentdp/)."""

from __future__ import annotations

import pytest

from evaluation.vote_selection import compare
from evaluation.vote_shape import FACTORS, SHAPES, chosen, compare_shapes
from training.store import load_from_store


@pytest.mark.slow
def test_shapes_are_compared_on_the_same_documents_and_simplex_is_scored_as_served(
    quick_bundle_tag: str,
) -> None:
    bundle = load_from_store(quick_bundle_tag)
    epsilons = [1.0, 3.0]
    scores = compare_shapes(bundle, epsilons, factors=(0.5, 1.0))
    assert set(scores) == {
        (split, shape, factor, eps)
        for split in ("validation", "test")
        for shape in SHAPES
        for factor in (0.5, 1.0)
        for eps in epsilons
    }
    assert all(0.0 <= value <= 1.0 for value in scores.values())
    served = {(split, eps): row for split, eps, *row in compare(bundle, epsilons)}
    vote = bundle.votes[0]
    checked = 0
    for (split, shape, factor, eps), value in scores.items():
        runs_vote_0 = bundle.manifest.choice_for(eps).vote_index == 0
        if shape == vote.shape and factor == 1.0 and runs_vote_0:
            flip, by_count = served[(split, eps)][1:]
            assert value == pytest.approx(by_count if vote.by_count else flip)
            checked += 1
    assert checked
    factor, validation, _ = chosen(scores, "cube", 1.0)
    assert factor in (0.5, 1.0)
    assert validation == max(scores[("validation", "cube", f, 1.0)] for f in (0.5, 1.0))
    assert FACTORS[2] == 1.0  # the bundle's own temperature is on the default grid
