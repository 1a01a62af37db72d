"""The fitted selection table over hard votes: a distribution, epsilon-SentDP, never below the
exponential mechanism it could have been, never above group privacy's bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from evaluation.vote_lp import (
    LARGEST,
    compare,
    cutoffs,
    exponential_rule,
    fit_rule,
    largest_ratio,
)
from sentdp.vote_table import histogram, neighbour_pairs, partitions


def _accuracy(rule, documents) -> float:  # type: ignore[no-untyped-def]
    return float(sum(rule.probabilities(counts)[truth] for counts, truth in documents))


def _brute_force_ratio(rule, n: int, classes: int) -> float:  # type: ignore[no-untyped-def]
    """The largest ratio over every vote vector (not histogram) and every single moved vote,
    independent of :func:`neighbour_pairs`."""
    worst = 1.0
    for votes in itertools.product(range(classes), repeat=n):
        counts = np.bincount(votes, minlength=classes)
        before = rule.probabilities(counts)
        for position, other in itertools.product(range(n), range(classes)):
            moved = list(votes)
            moved[position] = other
            after = rule.probabilities(np.bincount(moved, minlength=classes))
            worst = max(worst, float(np.max(before / after)))
    return worst


def _random_documents(n: int, classes: int, count: int, seed: int) -> list[tuple[list[int], int]]:
    """Documents whose sentences vote for their class with probability 0.6, else at random."""
    rng = np.random.default_rng(seed)
    documents = []
    for _ in range(count):
        truth = int(rng.integers(classes))
        votes = np.where(rng.random(n) < 0.6, truth, rng.integers(classes, size=n))
        documents.append((np.bincount(votes, minlength=classes).tolist(), truth))
    return documents


def test_partitions_and_histograms() -> None:
    assert len(list(partitions(10))) == 42
    assert sorted(partitions(4)) == [(1, 1, 1, 1), (2, 1, 1), (2, 2), (3, 1), (4,)]
    assert histogram([0, 3, 1, 0, 3]) == (3, 3, 1)
    # moving one vote between two of three classes: (2,) -> (1, 1), and each class's count
    pairs = neighbour_pairs(2, 3)
    assert (((2,), 2), ((1, 1), 1)) in pairs  # the class that lost a vote
    assert (((2,), 0), ((1, 1), 1)) in pairs  # the class that gained it
    assert (((2,), 0), ((1, 1), 0)) in pairs  # the class that neither lost nor gained
    assert (((2,), 2), ((1, 1), 0)) not in pairs


@pytest.mark.parametrize(
    ("n", "classes", "epsilon"), [(2, 3, 1.0), (4, 5, 1.0), (3, 6, 0.5), (5, 13, 3.0)]
)
def test_the_fitted_table_is_an_epsilon_sentdp_distribution_at_least_as_good_as_the_exponential(
    n: int, classes: int, epsilon: float
) -> None:
    documents = _random_documents(n, classes, 200, seed=n)
    rule = fit_rule(n, classes, epsilon, documents)
    for lam in partitions(n):
        if len(lam) > classes:
            continue
        full = list(lam) + [0] * (classes - len(lam))
        probabilities = rule.probabilities(full)
        assert probabilities.min() >= -1e-12
        assert probabilities.sum() == pytest.approx(1.0, abs=1e-9)
    assert largest_ratio(rule) <= math.exp(epsilon) * (1 + 1e-7)
    if classes**n <= 1000:  # every vote vector and every replaced sentence
        assert _brute_force_ratio(rule, n, classes) <= math.exp(epsilon) * (1 + 1e-7)
    reference = exponential_rule(n, classes, epsilon)
    assert largest_ratio(reference) <= math.exp(epsilon) * (1 + 1e-12)
    assert _accuracy(rule, documents) >= _accuracy(reference, documents) - 1e-6
    # the exponential mechanism at the whole epsilon per vote is not epsilon-SentDP here
    assert largest_ratio(exponential_rule(n, classes, 2 * epsilon)) > math.exp(epsilon) * 1.01


@pytest.mark.parametrize(("n", "classes", "epsilon"), [(2, 3, 1.0), (3, 4, 0.5)])
def test_unanimous_documents_get_no_more_than_group_privacy_allows(
    n: int, classes: int, epsilon: float
) -> None:
    documents = [([n if c == k else 0 for c in range(classes)], k) for k in range(classes)]
    rule = fit_rule(n, classes, epsilon, documents * 3)
    right = rule.probabilities([n] + [0] * (classes - 1))[0]
    bound = math.exp(n * epsilon) / (math.exp(n * epsilon) + classes - 1)
    exponential = math.exp(n * epsilon / 2) / (math.exp(n * epsilon / 2) + classes - 1)
    assert exponential - 1e-9 <= right <= bound + 1e-9
    assert right > exponential + 0.01  # the table gains over the exponential mechanism here


def test_a_table_refuses_documents_of_another_length() -> None:
    with pytest.raises(ValueError, match="sum to 3, not 2"):
        fit_rule(2, 3, 1.0, [([2, 1, 0], 0)])


@pytest.mark.slow
def test_the_comparison_runs_on_a_real_bundle(quick_bundle_tag: str) -> None:
    rows = compare(quick_bundle_tag, [1.0, 50.0])
    assert [row[0] for row in rows] == [1.0, 50.0]
    for _, served, exponential, table in rows:
        assert 0.0 <= min(served, exponential, table) <= max(served, exponential, table) <= 1.0
    # at epsilon 50 every rule follows the votes: the hard-vote rules agree
    assert rows[1][3] == pytest.approx(rows[1][2], abs=0.02)
    [(epsilon, scores, chosen, before, after)] = cutoffs(quick_bundle_tag, [1.0])
    assert epsilon == 1.0
    assert len(scores) == LARGEST + 1
    assert scores[chosen] == max(scores)
    assert 0.0 <= min(scores) <= max(scores) <= 1.0
    assert 0.0 <= min(before, after) <= max(before, after) <= 1.0
    if chosen == 0:  # no table chosen: test is scored exactly as before
        assert after == before
