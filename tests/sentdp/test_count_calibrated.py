"""The vote's exponential mechanism calibrated to the sentence count: the closed-form worst
case against searches over documents, exact neighbour ratios of the served distribution with
integer and adversarial votes, the sampler, the floor and the public rule."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import logsumexp
from scipy.stats import chisquare

from sentdp.count_calibrated import count_loss, count_rate, uses_count_rate
from sentdp.errors import InputError, InternalError
from sentdp.labels import (
    VOTE_UNITS,
    SentenceVote,
    vote_epsilon,
    vote_log_probs,
    vote_plan,
)
from sentdp.sampling import GAMMA, SAMPLER_ABS_ERROR, draw_many, draw_words
from tests.sentdp.test_labels import D, pushes, vote
from tests.sentdp.test_sampling import exact_sampler_probabilities

U = VOTE_UNITS


def loss(z: float, others: np.ndarray, before: np.ndarray, after: np.ndarray, c: int) -> float:
    """ln P(c | W + before) - ln P(c | W + after) for P(c) ~ exp(z tally_c / U), computed
    directly (no closed form): the quantity :func:`count_loss` bounds."""
    beta = z / U
    first, second = beta * (others + before), beta * (others + after)
    return float(first[c] - logsumexp(first) - second[c] + logsumexp(second))


def simplex(rng: np.random.Generator, classes: int, total: float) -> np.ndarray:
    """A random point of ``{x >= 0, sum(x) <= total}`` (interior, faces and vertices)."""
    kind = rng.integers(3)
    if kind == 0:
        return rng.dirichlet(np.ones(classes) * rng.choice([0.1, 1.0])) * total * rng.random()
    point = np.zeros(classes)
    point[rng.integers(classes)] = total if kind == 1 else total * rng.random()
    return point


@pytest.mark.parametrize("classes", [2, 3, 13])
@pytest.mark.parametrize("sentences", [1, 2, 3, 8])
def test_no_document_loses_more_than_the_closed_form_and_the_named_one_reaches_it(
    classes: int, sentences: int
) -> None:
    rng = np.random.default_rng(classes * 100 + sentences)
    total = (sentences - 1) * U
    for z in (0.2, 1.0, 2.5):
        bound = count_loss(z, sentences, classes)
        assert z - 1e-12 <= bound <= 2 * z + 1e-12  # between the count-free bounds
        worst = -math.inf
        for _ in range(300):  # other votes, replaced vote and replacement anywhere
            others = simplex(rng, classes, total)
            before, after = simplex(rng, classes, U), simplex(rng, classes, U)
            worst = max(worst, loss(z, others, before, after, int(rng.integers(classes))))
        # the optimiser from random starts, with the vertices the proof puts v and v' at
        c, b = 0, 1

        def negative(x: np.ndarray, z: float = z, c: int = c, b: int = b) -> float:
            others = np.abs(x)
            others *= min(1.0, total / max(others.sum(), 1e-300))
            return -loss(z, others, U * np.eye(classes)[c], U * np.eye(classes)[b], c)

        if total > 0:
            for _ in range(3):
                start = simplex(rng, classes, total)
                found = minimize(negative, start, method="Nelder-Mead", options={"maxiter": 4000})
                worst = max(worst, -float(found.fun))
        assert worst <= bound + 1e-12
        named = np.zeros(classes)
        named[b] = total
        reached = loss(z, named, U * np.eye(classes)[c], U * np.eye(classes)[b], c)
        assert reached == pytest.approx(bound, abs=1e-12)


def test_the_rate_is_the_largest_the_bound_allows() -> None:
    for classes in (2, 5, 13, 40):
        for epsilon in (0.1, 1.0, 3.0, 20.0):
            # L_1(z) = z: all of epsilon but the margin the float evaluation keeps
            assert count_rate(epsilon, 1, classes) == pytest.approx(epsilon, rel=1e-7)
            previous = math.inf
            for sentences in (1, 2, 3, 5, 10, 100, 10_000):
                z = count_rate(epsilon, sentences, classes)
                assert epsilon / 2 <= z <= previous
                assert count_loss(z, sentences, classes) <= epsilon
                if z > epsilon / 2:  # tight: the rate uses the whole epsilon but the margin
                    assert count_loss(z, sentences, classes) > epsilon * (1 - 1e-7) - 1e-8
                previous = z
            assert count_rate(epsilon, 10_000, classes) == pytest.approx(epsilon / 2, rel=1e-3)
    assert count_rate(1.0, 10**7, 13) == 0.5  # past the float-safe range: the standard rate
    with pytest.raises(InternalError):
        count_rate(0.0, 3, 5)
    with pytest.raises(InternalError):
        count_loss(1.0, 0, 5)


def test_the_rule_prefers_the_calibrated_mechanism_for_short_documents_only() -> None:
    """At 13 classes (clothing reviews): n <= 6 at epsilon 1, n <= 2 at 3, n = 1 from 6 on."""
    for epsilon, longest in ((1.0, 6), (3.0, 2), (6.0, 1), (10.0, 1), (50.0, 1)):
        run_at = vote_epsilon(epsilon, 13)
        chosen = [n for n in range(1, 200) if uses_count_rate(run_at, n, 13)]
        assert chosen == list(range(1, longest + 1))
    assert [n for n in range(1, 50) if uses_count_rate(vote_epsilon(1.0, 2), n, 2)] == [1]


def tallies_of(votes: np.ndarray) -> np.ndarray:
    deviations: np.ndarray = votes.sum(axis=0).max() - votes.sum(axis=0)
    return deviations.astype(np.int64)


def integer_votes(rng: np.random.Generator, classes: int, count: int) -> np.ndarray:
    """Integer votes as the vote casts them: ``floor(U p)`` for a softmax p, some one-hot."""
    probs = rng.dirichlet(np.ones(classes) * rng.choice([0.05, 0.5, 2.0]), size=count)
    votes = np.floor(probs * U).astype(np.int64)
    hot = rng.random(count) < 0.3
    votes[hot] = U * np.eye(classes, dtype=np.int64)[rng.integers(classes, size=hot.sum())]
    return votes


@pytest.mark.parametrize("classes", [2, 3, 13, 40])
@pytest.mark.parametrize("epsilon", [0.3, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("sentences", [1, 2, 3, 6])
def test_replacing_one_vote_moves_no_log_probability_by_more_than_epsilon(
    classes: int, epsilon: float, sentences: int
) -> None:
    """The served distribution (calibrated or permute-and-flip, as the rule picks, with the
    floor) for n-sentence neighbours: random integer votes, and the adversarial pair."""
    rng = np.random.default_rng(classes + sentences)
    worst = 0.0
    documents = [integer_votes(rng, classes, sentences) for _ in range(150)]
    adversarial = U * np.eye(classes, dtype=np.int64)[[0] + [1] * (sentences - 1)]
    documents.append(adversarial)
    for document in documents:
        base = vote_log_probs(tallies_of(document), epsilon, sentences)
        replacements = list(integer_votes(rng, classes, 6))
        replacements += [U * np.eye(classes, dtype=np.int64)[c] for c in range(min(classes, 4))]
        for j in {0, sentences - 1}:
            for replacement in replacements:
                changed = document.copy()
                changed[j] = replacement
                moved = vote_log_probs(tallies_of(changed), epsilon, sentences)
                shift = float(np.max(np.abs(moved - base)))
                assert shift <= epsilon + 1e-9
                worst = max(worst, shift)
    # the bound is nearly reached where the floor lets it be (so this test can fail)
    floor = math.log(classes / GAMMA)
    assert worst > 0.9 * min(epsilon, floor) or not uses_count_rate(
        vote_epsilon(epsilon, classes), sentences, classes
    )


@pytest.mark.parametrize("sentences", [1, 2, 5])
def test_a_vote_by_count_on_adversarial_sentences_keeps_epsilon(sentences: int) -> None:
    """Through SentenceVote: embeddings that push all of a sentence's vote to one class."""
    mechanism = vote(sentences).counted()
    rng = np.random.default_rng(sentences)
    for epsilon in (0.5, 1.0, 3.0):
        for leader in range(3):
            document = np.stack([pushes(mechanism, leader)] * sentences)
            document += rng.normal(size=document.shape) * 0.1
            base = mechanism.log_probs(document, epsilon)
            for c in range(5):
                for strength in (50.0, 1e6):
                    changed = document.copy()
                    changed[0] = pushes(mechanism, c, strength)
                    shift = np.max(np.abs(mechanism.log_probs(changed, epsilon) - base))
                    assert shift <= epsilon + 1e-9


def test_by_count_sharpens_short_documents_and_leaves_long_ones_to_permute_and_flip() -> None:
    mechanism = vote(2)
    counted = mechanism.counted()
    one = pushes(mechanism, 2)[None, :]
    flip = np.exp(mechanism.log_probs(one, 3.0))
    calibrated = np.exp(counted.log_probs(one, 3.0))
    assert np.argmax(calibrated) == np.argmax(flip) == 2
    assert calibrated[2] > flip[2] + 0.1  # a unanimous one-sentence vote: much more often
    long = np.stack([pushes(mechanism, 2)] * 12)
    assert np.array_equal(counted.log_probs(long, 3.0), mechanism.log_probs(long, 3.0))
    assert counted.same_as(counted)
    assert not counted.same_as(mechanism)
    assert counted.scaled(2.0).by_count
    assert not counted.counted(False).by_count


@pytest.mark.parametrize("sentences", [1, 2, 4])
@pytest.mark.parametrize("epsilon", [0.5, 3.0, 50.0])
def test_the_sampler_is_within_2_pow_minus_50_and_above_the_floor(
    sentences: int, epsilon: float
) -> None:
    deviations = np.array([0, 7, 64, 64, 190])[:5]
    plan = vote_plan(deviations, epsilon, sentences)
    exact = exact_sampler_probabilities(plan)
    assert sum(exact) == 1
    assert min(exact) >= Fraction(GAMMA) * Fraction(1, 5) * (1 - Fraction(1, 2**100))
    log_probs = vote_log_probs(deviations, epsilon, sentences)
    for cls, p in enumerate(exact):
        assert abs(float(p) - float(np.exp(log_probs[cls]))) <= SAMPLER_ABS_ERROR


def test_draws_follow_the_calibrated_distribution_and_permute_and_flip_is_told_apart() -> None:
    deviations = np.array([0, 20, 64, 64, 100])
    words = draw_words(np.random.default_rng(11), 200_000)
    drawn = draw_many(vote_plan(deviations, 1.0, 1), words)
    observed = np.bincount(drawn, minlength=5)
    expected = np.exp(vote_log_probs(deviations, 1.0, 1))
    assert chisquare(observed, expected * 200_000 / expected.sum()).pvalue > 1e-3
    wrong = np.exp(vote_log_probs(deviations, 1.0))  # permute-and-flip, as before
    assert chisquare(observed, wrong * 200_000 / wrong.sum()).pvalue < 1e-6


def test_bad_sentence_counts_fail_closed() -> None:
    for bad in (0, -1, True, 2.0):
        with pytest.raises(InternalError):
            vote_plan(np.array([0, 3, 5]), 1.0, bad)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        vote_plan(np.array([0, 3, 5]), 0.0, 2)
    with pytest.raises(InputError):
        SentenceVote(np.zeros((3, D)), np.zeros(3), by_count=True).log_probs(np.zeros((0, D)), 1.0)


def test_a_bundle_keeps_its_vote_rule_and_says_version_5(tmp_path: Path) -> None:
    import json

    from sentdp.bundle import Bundle, BundleManifest
    from tests.service.fakes import tiny_bundle

    (tmp_path / "encoder").mkdir()
    bundle = tiny_bundle(encoder_dir=tmp_path / "encoder", vote=True, by_count=True)
    bundle.save(tmp_path / "saved")
    loaded = Bundle.load(tmp_path / "saved")
    assert loaded.manifest.vote_by_count
    assert loaded.vote is not None
    assert loaded.vote.by_count
    assert loaded.vote.same_as(bundle.votes[0])
    manifest = json.loads((tmp_path / "saved" / "manifest.json").read_text())
    assert (manifest["format_version"], manifest["vote_by_count"]) == (5, True)
    # a version-4 reader would draw every vote by permute-and-flip: such a manifest is refused
    with pytest.raises(ValueError, match="sentence-count rule need bundle format version 5"):
        BundleManifest.model_validate({**manifest, "format_version": 4})
    # the rule is the manifest's: a vote that disagrees with it is refused
    with pytest.raises(InputError, match="vote_by_count must be every simplex vote's rule"):
        Bundle(
            bundle.manifest,
            bundle.variants,
            None,
            bundle.encoder_dir,
            (bundle.votes[0].counted(False),),
        )
    # bundles without the field keep permute-and-flip
    old = tiny_bundle(encoder_dir=tmp_path / "encoder", vote=True)
    old.save(tmp_path / "old")
    saved = json.loads((tmp_path / "old" / "manifest.json").read_text())
    saved.pop("vote_by_count")
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(saved))
    reloaded = Bundle.load(tmp_path / "old")
    assert reloaded.vote is not None
    assert not reloaded.vote.by_count
    assert reloaded.manifest.format_version == 1


@pytest.mark.parametrize("classes", [2, 3, 13, 40])
@pytest.mark.parametrize("sentences", [1, 2, 6])
def test_a_bounded_range_draw_spans_at_most_epsilon_where_the_others_do_not(
    classes: int, sentences: int
) -> None:
    """zCDP's charge epsilon**2 / 8 needs epsilon-bounded range: the log ratios of all
    classes between neighbours within an interval of width epsilon. The bounded-range draw
    (the standard exponential mechanism) has it; permute-and-flip and the sentence-count rule
    are epsilon-DP but spread further, which is why zCDP tenants never get them."""
    mechanism = vote(classes, classes=classes).counted()
    rng = np.random.default_rng(classes * 7 + sentences)
    for epsilon in (0.3, 1.0, 3.0):
        worst = {"bounded": 0.0, "own": 0.0}
        documents = [integer_votes(rng, classes, sentences) for _ in range(60)]
        documents.append(U * np.eye(classes, dtype=np.int64)[[0] + [1] * (sentences - 1)])
        for document in documents:
            for j in {0, sentences - 1}:
                for replacement in [U * np.eye(classes, dtype=np.int64)[c] for c in range(2)]:
                    changed = document.copy()
                    changed[j] = replacement
                    before, after = tallies_of(document), tallies_of(changed)
                    for kind, bounded in (("bounded", True), ("own", False)):
                        ratios = mechanism.log_probs_for(
                            before, epsilon, sentences, bounded_range=bounded
                        ) - mechanism.log_probs_for(
                            after, epsilon, sentences, bounded_range=bounded
                        )
                        span = float(ratios.max() - ratios.min())
                        worst[kind] = max(worst[kind], span)
        assert worst["bounded"] <= epsilon + 1e-9
        assert worst["bounded"] > 0.9 * epsilon  # reached: the test can fail
        if classes == 2 or uses_count_rate(vote_epsilon(epsilon, classes), sentences, classes):
            assert worst["own"] > 1.1 * epsilon  # not bounded range


def test_the_vote_s_slack_covers_the_bounded_range_draw() -> None:
    """The bounded-range draw runs at the vote's epsilon - eta(r); its range needs the
    exponential mechanism's own slack (privacy_slack, which counts the range) below that."""
    from sentdp.labels import bounded_vote_plan, vote_slack
    from sentdp.mechanism import privacy_slack

    for classes in range(2, 200):
        assert vote_slack(classes) >= privacy_slack(classes)
    deviations = np.array([0, 7, 64, 64, 190])
    for epsilon in (0.5, 3.0):
        exact = exact_sampler_probabilities(bounded_vote_plan(deviations, epsilon))
        log_probs = vote(1).log_probs_for(deviations, epsilon, 1, bounded_range=True)
        assert sum(exact) == 1
        for cls, p in enumerate(exact):
            assert abs(float(p) - float(np.exp(log_probs[cls]))) <= SAMPLER_ABS_ERROR
