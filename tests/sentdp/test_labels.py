"""SentenceVote, the label mechanism: exact neighbour ratios, the sampler's distribution, the
floor, and votes that depend on their own sentence only."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from sentdp.errors import InputError
from sentdp.labels import VOTE_UNITS, SentenceVote, sampler_epsilon, vote_log_probs
from sentdp.mechanism import mechanism_epsilon
from sentdp.sampling import GAMMA, SAMPLER_ABS_ERROR, draw_many, draw_words, plan_selection
from tests.sentdp.test_sampling import exact_sampler_probabilities

D, R = 24, 5


def vote(seed: int = 0, scale: float = 3.0, classes: int = R) -> SentenceVote:
    rng = np.random.default_rng(seed)
    return SentenceVote(rng.normal(size=(classes, D)) * scale, rng.normal(size=classes))


def pushes(mechanism: SentenceVote, cls: int, strength: float = 50.0) -> np.ndarray:
    """An adversarial sentence: the embedding that votes (almost) entirely for ``cls``."""
    w = mechanism.weights
    direction = w[cls] - w.mean(axis=0)
    return strength * direction / np.linalg.norm(direction)


def neighbours(mechanism: SentenceVote, rng: np.random.Generator) -> list[np.ndarray]:
    """Replacements for one sentence: adversarial for every class, far, zero, random."""
    out = [pushes(mechanism, c) for c in range(R)]
    out += [pushes(mechanism, c, 1e6) for c in range(R)]
    out += [np.zeros(D), rng.normal(size=D) * 1e3, rng.normal(size=D)]
    return out


def documents(mechanism: SentenceVote, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A document led by each class, and one tied between two classes (where the bound is
    reached: moving one vote from one leader to the other moves both tallies)."""
    noise = rng.normal(size=(k, D)) * 0.1
    led = [np.stack([pushes(mechanism, c)] * k) + noise for c in range(R)]
    tied = np.stack([pushes(mechanism, j % 2) for j in range(k)]) + noise
    return [*led, tied]


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0, 10.0, 100.0])
@pytest.mark.parametrize("k", [1, 2, 7, 40])
def test_replacing_any_sentence_moves_every_log_probability_by_at_most_epsilon(
    epsilon: float, k: int
) -> None:
    mechanism = vote(k)
    rng = np.random.default_rng(k)
    worst = 0.0
    for document in documents(mechanism, k, rng):
        base = mechanism.log_probs(document, epsilon)
        for j in {0, k - 1}:
            for replacement in neighbours(mechanism, rng):
                changed = document.copy()
                changed[j] = replacement
                shift = np.max(np.abs(mechanism.log_probs(changed, epsilon) - base))
                assert shift <= epsilon + 1e-9
                worst = max(worst, float(shift))
    # The bound is nearly reached (so the test can fail), up to what the floor allows (no
    # probability falls below gamma / r): fully where two classes tie exactly (even k),
    # half of it otherwise.
    floor = np.log(R / GAMMA)
    assert worst > 0.45 * min(epsilon, floor)
    if k % 2 == 0:
        assert worst > 0.9 * min(epsilon - np.log(2), floor)


@pytest.mark.parametrize("classes", [2, 5, 13])  # numpy sums in another order from 8 on
def test_a_vote_changes_by_at_most_the_units_and_depends_on_its_sentence_alone(
    classes: int,
) -> None:
    mechanism = vote(1, classes=classes)
    rng = np.random.default_rng(2)
    sentences = rng.normal(size=(130, D)) * 5
    votes = mechanism.votes(sentences)
    assert votes.min() >= 0
    assert votes.max() <= VOTE_UNITS
    for n in (1, 3, 64, 65):  # alone, and inside blocks of every shape
        assert np.array_equal(mechanism.votes(sentences[:n]), votes[:n])
    assert np.array_equal(mechanism.votes(sentences[::-1])[::-1], votes)


@pytest.mark.parametrize("epsilon", [0.5, 3.0, 50.0])
def test_every_class_within_2_pow_minus_50_of_log_probs_and_above_the_floor(
    epsilon: float,
) -> None:
    mechanism = vote(3)
    document = np.random.default_rng(4).normal(size=(9, D)) * 4
    deviations = mechanism.deviations(document)
    plan = plan_selection(deviations, sampler_epsilon(epsilon, R))
    exact = exact_sampler_probabilities(plan)
    assert sum(exact) == 1
    assert min(exact) >= Fraction(GAMMA) * Fraction(1, R) * (1 - Fraction(1, 2**100))
    log_probs = mechanism.log_probs(document, epsilon)
    for cls, p in enumerate(exact):
        assert abs(float(p) - float(np.exp(log_probs[cls]))) <= SAMPLER_ABS_ERROR


def test_log_probs_are_the_exponential_mechanism_over_tallies() -> None:
    mechanism = vote(5)
    document = np.random.default_rng(6).normal(size=(6, D)) * 4
    tallies = mechanism.votes(document).sum(axis=0)
    eps = 2.0
    scores = mechanism_epsilon(eps, R) * tallies / (2 * VOTE_UNITS)  # eps - eta(r)
    expected = np.exp(scores - scores.max())
    expected /= expected.sum()
    got = np.exp(mechanism.log_probs(document, eps))
    assert np.allclose(got, (1 - GAMMA) * expected + GAMMA / R, rtol=1e-12, atol=0)


def test_draws_follow_the_exact_distribution_and_a_wrong_one_is_rejected() -> None:
    deviations = np.array([0, 40, 90, 150, 400])
    words = draw_words(np.random.default_rng(7), 200_000)
    drawn = draw_many(plan_selection(deviations, sampler_epsilon(3.0, R)), words)
    observed = np.bincount(drawn, minlength=R)
    expected = np.exp(vote_log_probs(deviations, 3.0)) * 200_000
    assert chisquare(observed, expected * 200_000 / expected.sum()).pvalue > 1e-3
    wrong = np.exp(vote_log_probs(deviations, 2.0)) * 200_000
    assert chisquare(observed, wrong * 200_000 / wrong.sum()).pvalue < 1e-6


def test_sample_batch_uses_one_plan_per_document_and_validates_before_drawing() -> None:
    mechanism = vote(8)
    rng = np.random.default_rng(9)
    documents = [pushes(mechanism, c)[None, :].repeat(30, axis=0) for c in range(R)]
    chosen = mechanism.sample_batch(documents, [50.0] * R, rng)
    assert list(chosen) == list(range(R))  # at a large epsilon each document's own class
    with pytest.raises(InputError):
        mechanism.sample_batch([documents[0], np.full((2, D), np.nan)], [1.0, 1.0], rng)
    with pytest.raises(InputError):
        mechanism.sample_batch(documents, [1.0], rng)


def test_malformed_classifiers_are_refused() -> None:
    with pytest.raises(InputError):
        SentenceVote(np.zeros((1, D)), np.zeros(1))
    with pytest.raises(InputError):
        SentenceVote(np.zeros((R, D)), np.zeros(R + 1))
    with pytest.raises(InputError):
        SentenceVote(np.full((R, D), np.inf), np.zeros(R))


def test_a_bundle_keeps_its_vote_and_refuses_a_table_that_needs_a_missing_one(
    tmp_path: Path,
) -> None:
    from sentdp.bundle import Bundle
    from tests.service.fakes import tiny_bundle

    (tmp_path / "encoder").mkdir()
    bundle = tiny_bundle(encoder_dir=tmp_path / "encoder", vote=True)
    bundle.save(tmp_path / "saved")
    loaded = Bundle.load(tmp_path / "saved")
    assert loaded.vote is not None
    assert bundle.vote is not None
    assert np.array_equal(loaded.vote.weights, bundle.vote.weights)
    assert np.array_equal(loaded.vote.bias, bundle.vote.bias)
    assert [c.label for c in loaded.manifest.p_table] == ["vote", "candidate"]
    (tmp_path / "saved" / "label_vote.safetensors").unlink()
    with pytest.raises(InputError, match="no vote"):
        Bundle.load(tmp_path / "saved")
    old = tiny_bundle(encoder_dir=tmp_path / "encoder")  # a bundle from before the vote
    old.save(tmp_path / "old")
    assert Bundle.load(tmp_path / "old").vote is None
