"""The graded-vote program of evaluation.graded_votes, checked by brute force: every vote
vector and every replaced sentence."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from evaluation.graded_votes import (
    graded_table,
    graded_units,
    histogram,
    needed,
    neighbour_pairs,
    states,
    table_probabilities,
)
from sentdp.sampling import GAMMA

Vote = tuple[int | None, int]  # (class, units): None abstains


def votes(classes: int) -> list[Vote]:
    return [(None, 0)] + [(c, g) for c in range(classes) for g in (1, 2)]


def units_of(vector: tuple[Vote, ...], classes: int) -> list[int]:
    units = [0] * classes
    for c, g in vector:
        if c is not None:
            units[c] += g
    return units


@pytest.mark.parametrize(
    ("sentences", "classes", "epsilon"), [(3, 3, 1.0), (2, 5, 0.5), (4, 2, 2.0)]
)
def test_every_neighbour_ratio_is_at_most_epsilon_and_reaches_it(
    sentences: int, classes: int, epsilon: float
) -> None:
    table = graded_table(sentences, classes, epsilon)
    worst = 0.0
    for vector in itertools.product(votes(classes), repeat=sentences):
        p = table_probabilities(table, units_of(vector, classes))
        assert p.sum() == pytest.approx(1.0, abs=1e-9)
        assert p.min() >= GAMMA / classes - 1e-12  # the floor
        for position, replacement in itertools.product(range(sentences), votes(classes)):
            neighbour = list(vector)
            neighbour[position] = replacement
            q = table_probabilities(table, units_of(tuple(neighbour), classes))
            worst = max(worst, float(np.max(np.log(p / q))))
    assert worst <= epsilon + 1e-6
    assert worst >= 0.9 * epsilon  # the rule does respond to the votes


def test_states_are_exactly_the_unit_partitions_some_votes_give() -> None:
    classes = 3
    for sentences in (1, 2, 3):
        given = {
            tuple(sorted((u for u in units_of(v, classes) if u), reverse=True))
            for v in itertools.product(votes(classes), repeat=sentences)
        }
        assert set(states(sentences, classes)) == given


def test_a_sure_unanimous_document_is_released_more_surely_than_an_unsure_one() -> None:
    table = graded_table(4, 5, 1.0)
    sure = table_probabilities(table, [8, 0, 0, 0, 0])[0]
    unsure = table_probabilities(table, [4, 0, 0, 0, 0])[0]
    assert sure > unsure > 1 / 5
    assert sure <= math.exp(4 * 1.0) / (math.exp(4 * 1.0) + 4) + 1e-9  # group privacy


def test_grades_follow_each_sentence_s_top_probability() -> None:
    logits = np.log(
        np.array([[0.9, 0.05, 0.05], [0.45, 0.35, 0.2], [0.2, 0.3, 0.5], [0.34, 0.33, 0.33]])
    )
    assert graded_units(logits, lo=0.35, hi=0.6) == [3, 0, 1]  # 2 + 1 for class 0, 1 for class 2
    assert graded_units(logits, lo=0.0, hi=0.0) == [6, 0, 2]
    assert needed([3, 0, 1]) == 3


def test_the_program_constrains_exactly_the_pairs_that_neighbours_give() -> None:
    classes = 3
    for sentences in (1, 2, 3):
        given = set()
        for vector in itertools.product(votes(classes), repeat=sentences):
            before = units_of(vector, classes)
            for position, replacement in itertools.product(range(sentences), votes(classes)):
                neighbour = list(vector)
                neighbour[position] = replacement
                after = units_of(tuple(neighbour), classes)
                for c in range(classes):
                    given.add(((histogram(before), before[c]), (histogram(after), after[c])))
        assert neighbour_pairs(sentences, classes) == given
