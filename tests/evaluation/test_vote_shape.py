"""Cube votes, the candidate measured by evaluation.vote_shape: in [0, U] per class (the
tallies' sensitivity stays U), a function of each sentence alone, the likeliest class given
all of U; and the comparison on a small real bundle."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.vote_selection import compare
from evaluation.vote_shape import FACTORS, SHAPES, chosen, compare_shapes, cube_votes
from sentdp.labels import VOTE_UNITS, SentenceVote
from training.store import load_from_store


def random_vote(rng: np.random.Generator, classes: int = 13, dim: int = 8) -> SentenceVote:
    return SentenceVote(rng.normal(size=(classes, dim)) * 3, rng.normal(size=classes))


def test_cube_votes_give_the_likeliest_class_all_of_a_unit_and_stay_in_the_cube() -> None:
    rng = np.random.default_rng(3)
    vote = random_vote(rng)
    x = np.concatenate([rng.normal(size=(50, 8)), rng.normal(size=(5, 8)) * 1e6, np.zeros((1, 8))])
    votes = cube_votes(vote, x)
    assert votes.shape == (56, 13)
    assert votes.min() >= 0
    assert (votes.max(axis=1) == VOTE_UNITS).all()
    logits = vote.logits(x)
    assert (votes.argmax(axis=1) == logits.argmax(axis=1)).all()
    expected = np.floor(VOTE_UNITS * np.exp(logits - logits.max(axis=1, keepdims=True)))
    np.testing.assert_array_equal(votes, expected)
    # simplex votes are the same logits normalised to sum 1: never above the cube's
    assert (vote.votes(x) <= votes).all()


def test_a_cube_vote_depends_on_its_own_sentence_only() -> None:
    rng = np.random.default_rng(4)
    vote = random_vote(rng)
    x = rng.normal(size=(40, 8))
    together = cube_votes(vote, x)
    for i in range(len(x)):
        np.testing.assert_array_equal(cube_votes(vote, x[i : i + 1])[0], together[i])


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
    for (split, shape, factor, eps), value in scores.items():
        if shape == "simplex" and factor == 1.0 and bundle.manifest.choice_for(eps).vote_index == 0:
            flip, by_count = served[(split, eps)][1:]
            assert value == pytest.approx(by_count if bundle.votes[0].by_count else flip)
    factor, validation, _ = chosen(scores, "cube", 1.0)
    assert factor in (0.5, 1.0)
    assert validation == max(scores[("validation", "cube", f, 1.0)] for f in (0.5, 1.0))
    assert FACTORS[2] == 1.0  # the bundle's own temperature is on the default grid
