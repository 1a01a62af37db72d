"""The data-free table over hard votes: exactly epsilon-SentDP with the floor (every vote
vector and every replaced sentence, adversarial ones included), a distribution, sharper than
the exponential mechanism for short documents, within group privacy, and drawn as computed."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from sentdp.errors import InputError, InternalError
from sentdp.labels import vote_epsilon
from sentdp.mechanism import DeepCandidate
from sentdp.sampling import _TWO64, GAMMA
from sentdp.vote_table import (
    LONGEST,
    check,
    entries,
    grid_epsilon,
    hard_vote_table,
    histogram,
    histograms,
)


def _largest_log_ratio(n: int, classes: int, epsilon: float) -> float:
    """The largest log ratio of the table's probabilities over every vote vector (each
    sentence's vote for any class) and every replacement of one sentence by any other vote,
    computed from the probabilities alone, not from the table's own neighbour list."""
    table = hard_vote_table(n, classes, epsilon)
    worst = 0.0
    for votes in itertools.product(range(classes), repeat=n):
        before = table.probabilities(np.bincount(votes, minlength=classes).tolist())
        for position, other in itertools.product(range(n), range(classes)):
            moved = list(votes)
            moved[position] = other
            after = table.probabilities(np.bincount(moved, minlength=classes).tolist())
            worst = max(worst, float(np.max(np.log(before) - np.log(after))))
    return worst


@pytest.mark.parametrize(
    ("n", "classes", "epsilon"),
    [(1, 5, 1.0), (2, 3, 0.5), (3, 4, 1.0), (4, 3, 3.0), (3, 6, 2.0), (5, 2, 1.0)],
)
def test_every_replaced_sentence_moves_every_class_by_at_most_e_to_the_epsilon(
    n: int, classes: int, epsilon: float
) -> None:
    worst = _largest_log_ratio(n, classes, epsilon)
    assert worst <= vote_epsilon(epsilon, classes) + 1e-9
    # and the table uses the budget: some pair comes close to it (so the test could fail)
    assert worst >= 0.9 * vote_epsilon(epsilon, classes)


@pytest.mark.parametrize(("n", "classes", "epsilon"), [(3, 13, 1.0), (7, 13, 0.5), (10, 4, 3.0)])
def test_each_histogram_is_a_distribution_with_the_floor(
    n: int, classes: int, epsilon: float
) -> None:
    table = hard_vote_table(n, classes, epsilon)
    for _, full in histograms(n, classes):
        probabilities = table.probabilities(full)
        assert probabilities.sum() == pytest.approx(1.0, abs=1e-12)
        assert probabilities.min() >= GAMMA / classes * (1 - 1e-12)
        # symmetric: classes holding as many votes are as likely
        for count in set(full):
            same = probabilities[np.asarray(full) == count]
            assert np.ptp(same) == 0.0


@pytest.mark.parametrize(("n", "epsilon"), [(1, 1.0), (2, 1.0), (3, 1.0), (1, 3.0)])
def test_a_unanimous_short_document_gets_group_privacys_bound_not_half_of_it(
    n: int, epsilon: float
) -> None:
    classes = 13
    table = hard_vote_table(n, classes, epsilon)
    right = table.probabilities([n] + [0] * (classes - 1))[0]
    made_at = table.epsilon  # epsilon rounded down to the tables' grid
    assert epsilon * 2 ** (-1 / 16) < made_at <= epsilon
    bound = math.exp(n * made_at) / (math.exp(n * made_at) + classes - 1)
    exponential = math.exp(n * epsilon / 2) / (math.exp(n * epsilon / 2) + classes - 1)
    assert right <= bound
    assert right >= bound - 0.005  # the LP margin and the slack cost almost nothing
    assert right > exponential + 0.05


@pytest.mark.parametrize(("n", "classes", "epsilon"), [(4, 3, 3.0), (5, 6, 1.0), (3, 13, 0.5)])
def test_the_plan_gives_every_class_its_exact_probability_in_every_order(
    n: int, classes: int, epsilon: float
) -> None:
    """From the plan's integer thresholds (what the sampler compares its random words with),
    every class of every permutation of every histogram is within 2**-63 of the exact
    probability the check passed."""
    table = hard_vote_table(n, classes, epsilon)
    seen = set()
    for lam, full in histograms(n, classes):
        for counts in set(itertools.permutations(full)) if classes <= 6 else {tuple(full)}:
            plan = table.plan(list(counts))
            edges = [0, *plan.thresholds, _TWO64]
            levels = len(plan.counts)
            for level in range(levels):
                share = Fraction(
                    edges[min(level + 1, len(edges) - 1)] - edges[min(level, len(edges) - 1)],
                    _TWO64,
                )
                start = plan.starts[level]
                for k in plan.order[start : start + plan.counts[level]]:
                    drawn = (
                        Fraction(GAMMA) / classes
                        + (1 - Fraction(GAMMA)) * share / plan.counts[level]
                    )
                    exact = table.exact((lam, counts[int(k)]))
                    assert abs(drawn - exact) <= Fraction(1, 2**63)
                    seen.add((lam, counts[int(k)]))
    assert seen == set(entries(n, classes))


def test_large_epsilons_release_the_plurality_and_odd_inputs_are_refused() -> None:
    for epsilon in (10.0, 25.0, 1000.0):
        table = hard_vote_table(3, 4, epsilon)
        assert table.probabilities([3, 0, 0, 0])[0] > 0.999
        assert table.probabilities([2, 1, 0, 0])[0] > 0.999
    with pytest.raises(InputError, match="integers"):
        hard_vote_table(3, 4, 1.0).plan([1.5, 1.5, 0, 0])  # type: ignore[list-item]
    with pytest.raises(InputError, match="integers"):
        hard_vote_table(3, 4, 1.0).plan([True, 2, 0, 0])
    for n, classes in ((True, 4), (3, 1), (3, 33), (3.0, 4)):
        with pytest.raises(InputError):
            hard_vote_table(n, classes, 1.0)  # type: ignore[arg-type]


def test_the_sampler_draws_the_tables_probabilities() -> None:
    table = hard_vote_table(4, 5, 1.0)
    counts = [2, 1, 1, 0, 0]
    expected = table.probabilities(counts)
    draws = 200_000
    rng = np.random.default_rng(7)
    picked = DeepCandidate.draw_plans([table.plan(counts)] * draws, rng)
    observed = np.bincount(picked, minlength=5)
    assert chisquare(observed, expected * draws).pvalue > 1e-3
    # not vacuous: the exponential mechanism's probabilities are rejected
    gap = np.array([0, 1, 1, 2, 2]) * vote_epsilon(1.0, 5) / 2
    other = np.exp(-gap) / np.exp(-gap).sum()
    assert chisquare(observed, other * draws).pvalue < 1e-6


def test_the_exact_check_refuses_a_table_one_entry_too_sharp() -> None:
    table = hard_vote_table(3, 4, 1.0)
    check(table, vote_epsilon(1.0, 4))  # the served table passes
    unanimous = ((3,), 3)
    sharper = dict(table.weights)
    sharper[unanimous] = sharper[unanimous] * 2
    with pytest.raises(InternalError, match="exceeds e\\^epsilon"):
        replace(table, weights=sharper)  # a table is checked as it is made
    with pytest.raises(TypeError):
        table.weights[unanimous] = 0  # type: ignore[index]  # and the cached one is read-only
    # the served table is checked at the epsilon it runs at, not above: it fails a smaller one
    with pytest.raises(InternalError):
        check(table, 0.95 * vote_epsilon(1.0, 4))


def test_the_table_depends_on_n_r_and_epsilon_alone_and_is_cached() -> None:
    assert hard_vote_table(3, 13, 1.0) is hard_vote_table(3, 13, 1.0)
    # epsilons between two grid points share one table: varying epsilon solves nothing new
    assert (
        hard_vote_table(3, 13, 1.01) is hard_vote_table(3, 13, 1.04) is hard_vote_table(3, 13, 1.0)
    )
    assert hard_vote_table(3, 13, 1.05).epsilon == 2 ** (1 / 16)
    for epsilon in (0.01, 0.5, 1.0, 3.0, 7.3, 10.0, 1e6):
        made_at = grid_epsilon(epsilon)
        assert made_at <= epsilon < made_at * 2 ** (1 / 16)
    assert set(hard_vote_table(3, 13, 1.0).weights) == set(entries(3, 13))
    assert histogram([0, 3, 1, 0, 3]) == (3, 3, 1)


def test_counts_and_lengths_it_was_not_made_for_are_refused() -> None:
    table = hard_vote_table(3, 4, 1.0)
    for counts in ([3, 0, 0], [2, 0, 0, 0], [4, -1, 0, 0]):
        with pytest.raises(InputError):
            table.plan(counts)
    with pytest.raises(InputError, match="1 to"):
        hard_vote_table(LONGEST + 1, 4, 1.0)
    with pytest.raises(InputError):
        hard_vote_table(3, 4, 0.001)


def test_the_vote_draws_short_documents_from_the_table_and_longer_ones_by_its_own_rule() -> None:
    from sentdp.labels import hard_counts
    from tests.service.fakes import DIM, tiny_bundle

    vote = tiny_bundle(vote=True).votes[0]
    rng = np.random.default_rng(5)
    short, long = rng.normal(size=(3, DIM)), rng.normal(size=(6, DIM))
    table = hard_vote_table(3, vote.classes, 2.0)
    expected = np.log(table.probabilities(hard_counts(vote.logits(short))))
    assert np.array_equal(vote.log_probs(short, 2.0, table_sentences=3), expected)  # n == N
    assert np.array_equal(vote.log_probs(short, 2.0, table_sentences=2), vote.log_probs(short, 2.0))
    assert not np.allclose(vote.log_probs(short, 2.0), expected)  # its own rule differs
    assert np.array_equal(vote.log_probs(long, 2.0, table_sentences=5), vote.log_probs(long, 2.0))
    bounded = vote.log_probs(short, 2.0, bounded_range=True)
    assert np.array_equal(
        vote.log_probs(short, 2.0, bounded_range=True, table_sentences=5), bounded
    )
    # an epsilon too small for a table: the vote's own rule, not an error
    assert np.array_equal(
        vote.log_probs(short, 0.003, table_sentences=5), vote.log_probs(short, 0.003)
    )
    for limit in (-1, LONGEST + 1, True):
        with pytest.raises(InputError, match="table limit"):
            vote.log_probs(short, 2.0, table_sentences=limit)  # type: ignore[arg-type]


def test_a_bundle_with_a_table_limit_says_version_8_and_keeps_it(tmp_path: Path) -> None:
    from sentdp.bundle import Bundle, BundleManifest
    from tests.service.fakes import tiny_bundle
    from training.pipeline import bundle_format_version

    (tmp_path / "encoder").mkdir()
    bundle = tiny_bundle(encoder_dir=tmp_path / "encoder", vote=True)
    p_table = [c.model_copy(update={"vote_table": 4}) for c in bundle.manifest.p_table]
    assert bundle_format_version(bundle.variants, bundle.manifest.p_table, bundle.votes) < 8
    assert bundle_format_version(bundle.variants, p_table, bundle.votes) == 8
    manifest = bundle.manifest.model_dump()
    with pytest.raises(ValueError, match="format version 8"):
        BundleManifest.model_validate({**manifest, "p_table": [c.model_dump() for c in p_table]})
    tabled = BundleManifest.model_validate(
        {**manifest, "format_version": 8, "p_table": [c.model_dump() for c in p_table]}
    )
    replace(bundle, manifest=tabled).save(tmp_path / "saved")
    loaded = Bundle.load(tmp_path / "saved")
    assert [c.vote_table for c in loaded.manifest.p_table] == [4] * len(p_table)


def test_two_bundles_share_a_vote_only_if_they_draw_short_documents_alike() -> None:
    from evaluation.experiment import _same_vote
    from tests.service.fakes import tiny_bundle

    assert _same_vote(tiny_bundle(vote=True, table=3), tiny_bundle(vote=True, table=3))
    assert not _same_vote(tiny_bundle(vote=True, table=3), tiny_bundle(vote=True))
