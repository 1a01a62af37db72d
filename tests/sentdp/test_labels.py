"""SentenceVote, the label mechanism: exact neighbour ratios, the sampler's distribution, the
floor, and votes that depend on their own sentence only."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chisquare

from sentdp.bundle import Bundle
from sentdp.errors import InputError
from sentdp.labels import (
    FLIP_MAX_CLASSES,
    VOTE_SHAPES,
    VOTE_UNITS,
    SentenceVote,
    VoteShape,
    vote_epsilon,
    vote_log_probs,
    vote_plan,
    vote_probabilities,
    vote_selection,
)
from sentdp.mechanism import privacy_slack
from sentdp.permute_flip import flip_slack
from sentdp.sampling import GAMMA, SAMPLER_ABS_ERROR, draw_many, draw_words
from sentdp.words import WordFeatures
from tests.sentdp.test_permute_flip import enumerated
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


def flat(mechanism: SentenceVote) -> np.ndarray:
    """A sentence whose logits are all equal: a cube vote gives every class all U units."""
    w, b = mechanism.weights, mechanism.bias
    x: np.ndarray = np.linalg.lstsq(w - w.mean(axis=0), b.mean() - b, rcond=None)[0]
    return x


def neighbours(mechanism: SentenceVote, rng: np.random.Generator) -> list[np.ndarray]:
    """Replacements for one sentence: adversarial for every class, far, zero, random, flat."""
    out = [pushes(mechanism, c) for c in range(R)]
    out += [pushes(mechanism, c, 1e6) for c in range(R)]
    out += [np.zeros(D), rng.normal(size=D) * 1e3, rng.normal(size=D), flat(mechanism)]
    return out


def documents(mechanism: SentenceVote, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A document led by each class, and one tied between two classes (where the bound is
    reached: moving one vote from one leader to the other moves both tallies)."""
    noise = rng.normal(size=(k, D)) * 0.1
    led = [np.stack([pushes(mechanism, c)] * k) + noise for c in range(R)]
    tied = np.stack([pushes(mechanism, j % 2) for j in range(k)]) + noise
    return [*led, tied]


@pytest.mark.parametrize("shape", VOTE_SHAPES)
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0, 10.0, 100.0])
@pytest.mark.parametrize("k", [1, 2, 7, 40])
def test_replacing_any_sentence_moves_every_log_probability_by_at_most_epsilon(
    epsilon: float, k: int, shape: VoteShape
) -> None:
    mechanism = vote(k).shaped(shape)
    rng = np.random.default_rng(k)
    worst = 0.0
    for bounded in (False, True):  # the vote's own rule, and the zCDP tenants' draw
        for document in documents(mechanism, k, rng):
            base = mechanism.log_probs(document, epsilon, bounded_range=bounded)
            for j in {0, k - 1}:
                for replacement in neighbours(mechanism, rng):
                    changed = document.copy()
                    changed[j] = replacement
                    moved = mechanism.log_probs(changed, epsilon, bounded_range=bounded)
                    shift = np.max(np.abs(moved - base))
                    assert shift <= epsilon + 1e-9
                    worst = max(worst, float(shift))
    assert_bound_nearly_reached(worst, epsilon, k)


def assert_bound_nearly_reached(worst: float, epsilon: float, k: int) -> None:
    """The largest shift seen nearly reaches the bound (so the tests can fail), up to what
    the floor allows (no probability falls below gamma / r): fully where two classes tie
    exactly (even k), half of it otherwise."""
    floor = np.log(R / GAMMA)
    assert worst > 0.45 * min(epsilon, floor)
    if k % 2 == 0:
        assert worst > 0.9 * min(epsilon - np.log(2), floor)


@pytest.mark.parametrize("shape", VOTE_SHAPES)
@pytest.mark.parametrize("classes", [2, 5, 13])  # numpy sums in another order from 8 on
def test_a_vote_changes_by_at_most_the_units_and_depends_on_its_sentence_alone(
    classes: int, shape: VoteShape
) -> None:
    mechanism = vote(1, classes=classes).shaped(shape)
    rng = np.random.default_rng(2)
    sentences = rng.normal(size=(130, D)) * 5
    votes = mechanism.votes(sentences)
    assert votes.min() >= 0
    assert votes.max() <= VOTE_UNITS
    for n in (1, 3, 64, 65):  # alone, and inside blocks of every shape
        assert np.array_equal(mechanism.votes(sentences[:n]), votes[:n])
    assert np.array_equal(mechanism.votes(sentences[::-1])[::-1], votes)


@pytest.mark.parametrize("shape", VOTE_SHAPES)
@pytest.mark.parametrize("epsilon", [0.5, 3.0, 50.0])
def test_every_class_within_2_pow_minus_50_of_log_probs_and_above_the_floor(
    epsilon: float, shape: VoteShape
) -> None:
    mechanism = vote(3).shaped(shape)
    document = np.random.default_rng(4).normal(size=(9, D)) * 4
    deviations = mechanism.deviations(document)
    plan = vote_plan(deviations, epsilon)
    exact = exact_sampler_probabilities(plan)
    assert sum(exact) == 1
    assert min(exact) >= Fraction(GAMMA) * Fraction(1, R) * (1 - Fraction(1, 2**100))
    log_probs = mechanism.log_probs(document, epsilon)
    for cls, p in enumerate(exact):
        assert abs(float(p) - float(np.exp(log_probs[cls]))) <= SAMPLER_ABS_ERROR


def permute_and_flip(tallies: np.ndarray, epsilon: float) -> list[Fraction]:
    """The mechanism as McKenna and Sheldon define it, by enumeration: visit the classes in
    every order; stop at class c with probability exp(eps' (n_c - n_max) / (2 U))."""
    run_at = vote_epsilon(epsilon, len(tallies))
    keep = [
        Fraction(math.exp(run_at * (int(n) - int(tallies.max())) / (2 * VOTE_UNITS)))
        for n in tallies
    ]
    return enumerated(keep)


@pytest.mark.parametrize("shape", VOTE_SHAPES)
@pytest.mark.parametrize("epsilon", [0.3, 1.0, 3.0, 20.0])
def test_log_probs_are_permute_and_flip_over_tallies(epsilon: float, shape: VoteShape) -> None:
    mechanism = vote(5).shaped(shape)
    document = np.random.default_rng(6).normal(size=(6, D)) * 4
    tallies = mechanism.votes(document).sum(axis=0)
    expected = [(1 - GAMMA) * float(p) + GAMMA / R for p in permute_and_flip(tallies, epsilon)]
    got = np.exp(mechanism.log_probs(document, epsilon))
    assert np.allclose(got, expected, rtol=1e-12, atol=0)
    # ... and not the exponential mechanism, which it beats: the leader is likelier.
    scores = vote_epsilon(epsilon, R) * tallies / (2 * VOTE_UNITS)
    exponential = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    leader = int(np.argmax(tallies))
    assert got[leader] > exponential[leader] + (1e-3 if epsilon <= 3 else 0)
    assert got @ tallies > exponential @ tallies


def test_the_vote_s_slack_covers_its_float_error() -> None:
    assert vote_epsilon(1.0, 13) == 1.0 - flip_slack(13)
    assert 0 < flip_slack(13) < 1e-6
    with pytest.raises(InputError):
        vote_epsilon(flip_slack(5) / 2, 5)
    with pytest.raises(InputError):
        vote_epsilon(float("nan"), 5)


def test_draws_follow_the_exact_distribution_and_a_wrong_one_is_rejected() -> None:
    deviations = np.array([0, 40, 90, 150, 400])
    words = draw_words(np.random.default_rng(7), 200_000)
    drawn = draw_many(vote_plan(deviations, 3.0), words)
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
    with pytest.raises(InputError, match="asks for vote 0 at epsilon 1, but the bundle has 0"):
        Bundle.load(tmp_path / "saved")
    old = tiny_bundle(encoder_dir=tmp_path / "encoder")  # a bundle from before the vote
    old.save(tmp_path / "old")
    assert Bundle.load(tmp_path / "old").vote is None


def test_a_bundle_with_a_vote_per_epsilon_keeps_them_all_and_says_version_3(
    tmp_path: Path,
) -> None:
    import json

    from safetensors.numpy import load_file, save_file

    from sentdp.bundle import BundleManifest
    from tests.service.fakes import tiny_bundle

    (tmp_path / "encoder").mkdir()
    bundle = tiny_bundle(encoder_dir=tmp_path / "encoder", vote=True, second_vote=True)
    bundle.save(tmp_path / "saved")
    loaded = Bundle.load(tmp_path / "saved")
    assert len(loaded.votes) == 2
    for got, want in zip(loaded.votes, bundle.votes, strict=True):
        assert np.array_equal(got.weights, want.weights)
        assert np.array_equal(got.bias, want.bias)
    assert not np.array_equal(loaded.votes[0].weights, loaded.votes[1].weights)
    assert loaded.vote_for(1.0) is loaded.votes[1]  # the p table's choice at epsilon 1
    assert loaded.vote_for(7.0) is loaded.votes[0]
    assert loaded.vote is loaded.votes[0]
    # a version-2 reader would serve vote 0 at epsilon 1: such a manifest is refused
    manifest = json.loads((tmp_path / "saved" / "manifest.json").read_text())
    assert manifest["format_version"] == 3
    with pytest.raises(ValueError, match="more than one vote needs bundle format version 3"):
        BundleManifest.model_validate({**manifest, "format_version": 2})
    # a file that lost vote 1 cannot serve the table that names it
    arrays = load_file(str(tmp_path / "saved" / "label_vote.safetensors"))
    save_file(
        {k: arrays[k] for k in ("weights", "bias")},
        str(tmp_path / "saved" / "label_vote.safetensors"),
    )
    with pytest.raises(InputError, match="asks for vote 1 at epsilon 1, but the bundle has 1"):
        Bundle.load(tmp_path / "saved")
    # a vote file that lost half a vote is refused by name, not half read
    save_file(
        {k: arrays[k] for k in ("weights", "bias", "weights_1")},
        str(tmp_path / "saved" / "label_vote.safetensors"),
    )
    with pytest.raises(InputError, match=r"should hold.*bias_1"):
        Bundle.load(tmp_path / "saved")


def test_a_p_table_naming_a_missing_vote_is_refused_on_any_row(tmp_path: Path) -> None:
    """Evaluation scores the vote at candidate rows too: an index past the votes is refused
    at load time whatever the row's label."""
    bundle = tiny_bundle_two_votes(tmp_path)
    table = [
        choice.model_copy(update={"label": "candidate", "vote_index": 2})
        if choice.epsilon == 1.0
        else choice
        for choice in bundle.manifest.p_table
    ]
    manifest = bundle.manifest.model_copy(update={"p_table": table})
    with pytest.raises(InputError, match="asks for vote 2 at epsilon 1, but the bundle has 2"):
        Bundle(manifest, bundle.variants, None, bundle.encoder_dir, bundle.votes)


def tiny_bundle_two_votes(tmp_path: Path) -> Bundle:
    from tests.service.fakes import tiny_bundle

    return tiny_bundle(encoder_dir=tmp_path, vote=True, second_vote=True)


@pytest.mark.parametrize("shape", VOTE_SHAPES)
def test_above_the_flip_limit_the_vote_is_the_exponential_mechanism(shape: VoteShape) -> None:
    classes = FLIP_MAX_CLASSES + 8
    assert vote_selection(FLIP_MAX_CLASSES) == "permute-and-flip"
    assert vote_selection(classes) == "exponential"
    mechanism = vote(11, classes=classes).shaped(shape)
    document = np.random.default_rng(12).normal(size=(6, D)) * 4
    tallies = mechanism.votes(document).sum(axis=0)
    assert vote_epsilon(2.0, classes) == 2.0 - privacy_slack(classes)
    scores = vote_epsilon(2.0, classes) * tallies / (2 * VOTE_UNITS)
    expected = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    got = np.exp(mechanism.log_probs(document, 2.0))
    assert np.allclose(got, (1 - GAMMA) * expected + GAMMA / classes, rtol=1e-12, atol=0)
    exact = exact_sampler_probabilities(vote_plan(mechanism.deviations(document), 2.0))
    assert max(abs(float(p) - g) for p, g in zip(exact, got, strict=True)) <= SAMPLER_ABS_ERROR
    base = mechanism.log_probs(document, 2.0)
    for replacement in [pushes(mechanism, c) for c in range(0, classes, 7)]:
        changed = document.copy()
        changed[0] = replacement
        assert np.max(np.abs(mechanism.log_probs(changed, 2.0) - base)) <= 2.0 + 1e-9


VOCABULARY = tuple(f"w{n:02d}" for n in range(30))


def word_vote(seed: int = 0, classes: int = R) -> SentenceVote:
    """A vote that reads words as well as embeddings, its word logits as large as its
    embedding logits."""
    rng = np.random.default_rng(seed)
    words = WordFeatures(VOCABULARY, 1.0 + rng.random(len(VOCABULARY)))
    return SentenceVote(
        rng.normal(size=(classes, D)) * 3,
        rng.normal(size=classes),
        rng.normal(size=(classes, len(VOCABULARY))) * 20,
        words,
    )


def word_pushes(mechanism: SentenceVote, cls: int, repeat: int = 1) -> str:
    """An adversarial text: the three words that favour ``cls`` most, ``repeat`` times."""
    assert mechanism.word_weights is not None
    u = mechanism.word_weights
    lead = u[cls] - u.mean(axis=0)
    best = [VOCABULARY[n] for n in np.argsort(-lead)[:3]]
    return " ".join(best * repeat)


@pytest.mark.parametrize("shape", VOTE_SHAPES)
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("k", [1, 2, 7])
def test_a_vote_that_reads_words_moves_no_log_probability_by_more_than_epsilon(
    epsilon: float, k: int, shape: VoteShape
) -> None:
    mechanism = word_vote(k).shaped(shape)
    rng = np.random.default_rng(k)
    noise = rng.normal(size=(k, D)) * 0.1
    docs = [
        (np.stack([pushes(mechanism, c)] * k) + noise, [word_pushes(mechanism, c)] * k)
        for c in range(R)
    ]
    tied = np.stack([pushes(mechanism, j % 2) for j in range(k)]) + noise
    docs.append((tied, [word_pushes(mechanism, j % 2) for j in range(k)]))
    replacements = [(pushes(mechanism, c), word_pushes(mechanism, c)) for c in range(R)]
    replacements += [
        (pushes(mechanism, c), word_pushes(mechanism, (c + 1) % R, 5000)) for c in range(R)
    ]
    replacements += [
        (np.zeros(D), ""),
        (np.zeros(D), "zzz unknown"),
        (rng.normal(size=D) * 1e3, "w00 " * 9999),
    ]
    worst = 0.0
    for document, texts in docs:
        base = mechanism.log_probs(document, epsilon, texts)
        for j in {0, k - 1}:
            for embedding, text in replacements:
                changed, changed_texts = document.copy(), list(texts)
                changed[j], changed_texts[j] = embedding, text
                shift = np.max(np.abs(mechanism.log_probs(changed, epsilon, changed_texts) - base))
                assert shift <= epsilon + 1e-9
                worst = max(worst, float(shift))
    assert_bound_nearly_reached(worst, epsilon, k)


def test_word_votes_depend_on_their_own_sentence_and_need_its_text() -> None:
    mechanism = word_vote(1)
    rng = np.random.default_rng(2)
    sentences = rng.normal(size=(130, D)) * 5
    texts = [" ".join(rng.choice(VOCABULARY, size=int(rng.integers(0, 12)))) for _ in range(130)]
    votes = mechanism.votes(sentences, texts)
    assert votes.min() >= 0
    assert votes.max() <= VOTE_UNITS
    for n in (1, 3, 64, 65):
        assert np.array_equal(mechanism.votes(sentences[:n], texts[:n]), votes[:n])
    assert np.array_equal(mechanism.votes(sentences[::-1], texts[::-1])[::-1], votes)
    # the words count: the same embeddings with other texts vote otherwise
    assert not np.array_equal(mechanism.votes(sentences, texts[1:] + texts[:1]), votes)
    with pytest.raises(InputError, match="pass their texts"):
        mechanism.votes(sentences)
    with pytest.raises(InputError, match="130 sentence embeddings but 129 texts"):
        mechanism.votes(sentences, texts[:-1])
    with pytest.raises(InputError, match="texts"):
        mechanism.plan_batch([sentences], [1.0], texts=[texts, texts])


def test_word_vote_draws_follow_its_exact_distribution() -> None:
    mechanism = word_vote(3)
    rng = np.random.default_rng(4)
    document = rng.normal(size=(6, D))
    texts = [word_pushes(mechanism, 2), "w01 w02", "", word_pushes(mechanism, 4), "zzz", "w03"]
    (plan,) = mechanism.plan_batch([document], [3.0], texts=[texts])
    observed = np.bincount(
        draw_many(plan, draw_words(np.random.default_rng(7), 200_000)), minlength=R
    )
    expected = np.exp(mechanism.log_probs(document, 3.0, texts))
    assert chisquare(observed, expected * 200_000 / expected.sum()).pvalue > 1e-3
    without = np.exp(word_vote(3).log_probs(document, 3.0, ["zzz"] * 6))  # words ignored
    assert chisquare(observed, without * 200_000 / without.sum()).pvalue < 1e-6
    exact = exact_sampler_probabilities(plan)
    assert min(exact) >= Fraction(GAMMA) * Fraction(1, R) * (1 - Fraction(1, 2**100))


def test_a_bundle_with_a_word_vote_round_trips_and_says_version_4(tmp_path: Path) -> None:
    import json

    from sentdp.bundle import BundleManifest
    from tests.service.fakes import WORDS, tiny_bundle

    (tmp_path / "encoder").mkdir()
    bundle = tiny_bundle(encoder_dir=tmp_path / "encoder", vote=True, second_vote=True, words=True)
    bundle.save(tmp_path / "saved")
    loaded = Bundle.load(tmp_path / "saved")
    assert not loaded.votes[0].reads_words
    assert loaded.votes[1].reads_words
    for got, want in zip(loaded.votes, bundle.votes, strict=True):
        assert got.same_as(want)
    assert not loaded.votes[1].same_as(SentenceVote(bundle.votes[1].weights, bundle.votes[1].bias))
    rng = np.random.default_rng(5)
    document = rng.normal(size=(4, bundle.votes[1].weights.shape[1]))
    texts = [f"{WORDS[0]} {WORDS[3]}", WORDS[5], "", f"{WORDS[1]} {WORDS[1]}"]
    assert np.array_equal(
        loaded.votes[1].votes(document, texts), bundle.votes[1].votes(document, texts)
    )
    manifest = json.loads((tmp_path / "saved" / "manifest.json").read_text())
    assert manifest["format_version"] == 4
    assert manifest["vote_words"] == "lower-word2-v1"
    with pytest.raises(ValueError, match="read words need bundle format version 4"):
        BundleManifest.model_validate({**manifest, "format_version": 3})
    with pytest.raises(ValueError, match="tokenizer"):
        BundleManifest.model_validate({**manifest, "vote_words": "another-v9"})
    # a manifest that hides its word vote, or claims one it lacks, is refused
    hidden = BundleManifest.model_validate({**manifest, "vote_words": None})
    with pytest.raises(InputError, match="vote_words"):
        Bundle(hidden, loaded.variants, None, loaded.encoder_dir, loaded.votes)
    (tmp_path / "saved" / "label_words.json").unlink()
    with pytest.raises(InputError, match="vocabulary"):
        Bundle.load(tmp_path / "saved")


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("not json", "cannot read"),
        ({"vocabulary": ["bank"]}, "cannot read"),
        ({"tokenizer": "another-v9", "vocabulary": ["bank"]}, "tokenizer"),
        ({"tokenizer": "lower-word2-v1", "vocabulary": None}, "do not hold a vocabulary"),
        ({"tokenizer": "lower-word2-v1", "vocabulary": "bankgoal"}, "do not hold a vocabulary"),
        ("short", "damaged"),
        ("duplicate", "damaged"),
        ("not a token", "damaged"),
        ("not a string", "damaged"),
        ("tiny idf", "damaged"),
        ("stray", "no vote reads"),
    ],
)
def test_a_damaged_vocabulary_is_refused_by_name(
    tmp_path: Path, damage: object, match: str
) -> None:
    import json

    from safetensors.numpy import load_file, save_file

    from tests.service.fakes import WORDS, tiny_bundle

    (tmp_path / "encoder").mkdir()
    words = tmp_path / "saved" / "label_words.json"
    weights = tmp_path / "saved" / "label_vote.safetensors"
    if damage == "stray":
        tiny_bundle(encoder_dir=tmp_path / "encoder", vote=True).save(tmp_path / "saved")
        words.write_text(json.dumps({"tokenizer": "lower-word2-v1", "vocabulary": list(WORDS)}))
    else:
        bundle = tiny_bundle(encoder_dir=tmp_path / "encoder", vote=True, words=True)
        bundle.save(tmp_path / "saved")
        vocabulary: list[object] = list(WORDS)
        if damage == "short":
            vocabulary = vocabulary[:-1]
        elif damage == "duplicate":
            vocabulary[1] = vocabulary[0]
        elif damage == "not a token":
            vocabulary[0] = "Bank"
        elif damage == "not a string":
            vocabulary[0] = ["bank"]
        elif damage == "tiny idf":
            arrays = load_file(str(weights))
            save_file({**arrays, "word_idf": np.full(len(WORDS), 1e-320)}, str(weights))
        stored: object = {"tokenizer": "lower-word2-v1", "vocabulary": vocabulary}
        if not isinstance(damage, str) or damage == "not json":
            stored = damage
        words.write_text(stored if isinstance(stored, str) else json.dumps(stored))
    with pytest.raises(InputError, match=match) as refused:
        Bundle.load(tmp_path / "saved")
    assert "label_" in str(refused.value)  # the message names the file


@pytest.mark.parametrize("shape", VOTE_SHAPES)
def test_a_vote_with_damaged_weights_fails_closed_instead_of_voting_out_of_range(
    shape: VoteShape,
) -> None:
    from sentdp.errors import InternalError

    mechanism = word_vote(2)
    assert mechanism.word_weights is not None
    finite_but_huge = np.full_like(mechanism.word_weights, 1.7e308)  # sums overflow
    huge = SentenceVote(
        mechanism.weights, mechanism.bias, finite_but_huge, mechanism.words, shape=shape
    )
    with pytest.raises(InternalError, match="not finite"):
        huge.votes(np.zeros((2, D)), ["w01 w02 w03", "w01"])


def test_a_cube_vote_gives_the_likeliest_class_every_unit_and_the_rest_their_ratio() -> None:
    """Cube votes as the module defines them, checked against the softmax itself: each row
    is U for its likeliest class and floor(U p_c / p_max) elsewhere, never below the simplex
    vote of the same sentence, and a function of its own sentence alone."""
    simplex = vote(13, scale=0.5)
    cube = simplex.shaped("cube")
    rng = np.random.default_rng(14)
    extreme = np.concatenate([rng.normal(size=(3, D)) * 1e6, np.zeros((1, D))])
    assert np.array_equal(cube.votes(extreme).max(axis=1), np.full(4, VOTE_UNITS))
    assert cube.votes(extreme).min() >= 0
    sentences = rng.normal(size=(50, D))
    logits = cube.logits(sentences)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    got = cube.votes(sentences)
    assert np.array_equal(got.max(axis=1), np.full(50, VOTE_UNITS))
    assert np.array_equal(got.argmax(axis=1), probs.argmax(axis=1))
    assert np.array_equal(got, np.floor(VOTE_UNITS * probs))  # U p_c / p_max, floored
    assert (got >= simplex.votes(sentences)).all()
    assert (got.sum(axis=1) > VOTE_UNITS).mean() > 0.5  # outside the simplex, as meant
    for n in (1, 7):
        assert np.array_equal(cube.votes(sentences[:n]), got[:n])


def test_a_cube_vote_is_never_drawn_by_count() -> None:
    """The sentence-count rule is proven for simplex votes: a cube vote refuses it, and
    shaping a vote by count into the cube drops it (permute-and-flip at every length)."""
    counted = vote(15).counted()
    with pytest.raises(InputError, match="simplex votes only"):
        SentenceVote(counted.weights, counted.bias, by_count=True, shape="cube")
    with pytest.raises(InputError, match="shape"):
        SentenceVote(counted.weights, counted.bias, shape="sphere")  # type: ignore[arg-type]
    cube = counted.shaped("cube")
    assert not cube.by_count
    assert cube.shaped("simplex").same_as(vote(15))
    assert not cube.same_as(vote(15))
    document = pushes(cube, 1)[None, :] + np.random.default_rng(16).normal(size=(1, D))
    flip = vote_log_probs(cube.deviations(document), 1.0)
    assert np.array_equal(cube.log_probs(document, 1.0), flip)
    assert not np.allclose(
        counted.log_probs(document, 1.0), vote_log_probs(counted.deviations(document), 1.0)
    )  # the simplex vote of one sentence is drawn by count, which differs


def test_cube_draws_follow_their_exact_distribution_not_the_simplex_s() -> None:
    """The sampler draws a cube vote's document from the cube's exact distribution
    (chi-square, 100,000 draws); the same classifier's simplex distribution is rejected."""
    simplex = vote(17, scale=0.4)
    cube = simplex.shaped("cube")
    document = np.random.default_rng(18).normal(size=(12, D))
    plan = cube.plan_for(cube.deviations(document), 2.0, len(document))
    drawn = draw_many(plan, draw_words(np.random.default_rng(19), 100_000))
    observed = np.bincount(drawn, minlength=R)
    expected = np.exp(cube.log_probs(document, 2.0))
    assert chisquare(observed, expected * 100_000 / expected.sum()).pvalue > 1e-3
    other = np.exp(simplex.log_probs(document, 2.0))
    assert chisquare(observed, other * 100_000 / other.sum()).pvalue < 1e-6


def test_a_bundle_with_a_cube_vote_round_trips_and_says_version_7(tmp_path: Path) -> None:
    import json

    from sentdp.bundle import BundleManifest
    from tests.service.fakes import tiny_bundle

    (tmp_path / "encoder").mkdir()
    bundle = tiny_bundle(
        encoder_dir=tmp_path / "encoder", vote=True, second_vote=True, by_count=True, cube=True
    )
    bundle.save(tmp_path / "saved")
    loaded = Bundle.load(tmp_path / "saved")
    assert [v.shape for v in loaded.votes] == ["simplex", "cube"]
    assert [v.by_count for v in loaded.votes] == [True, False]
    for got, want in zip(loaded.votes, bundle.votes, strict=True):
        assert got.same_as(want)
    assert loaded.vote_for(1.0).shape == "cube"
    manifest = json.loads((tmp_path / "saved" / "manifest.json").read_text())
    assert manifest["format_version"] == 7
    assert manifest["vote_shapes"] == ["simplex", "cube"]
    # an older reader would tally the cube vote as a softmax: version 6 is refused
    with pytest.raises(ValueError, match="cube need bundle format version 7"):
        BundleManifest.model_validate({**manifest, "format_version": 6})
    with pytest.raises(ValueError, match="vote_shapes"):
        BundleManifest.model_validate({**manifest, "vote_shapes": ["simplex", "sphere"]})
    with pytest.raises(ValueError, match="vote_colour"):  # unknown fields are not dropped
        BundleManifest.model_validate({**manifest, "vote_colour": "blue"})
    # a manifest whose shapes are not the votes' is refused, whichever way it errs
    for shapes in (None, ["cube", "cube"], ["simplex"]):
        wrong = BundleManifest.model_validate({**manifest, "vote_shapes": shapes})
        with pytest.raises(InputError, match=r"vote shapes|vote_shapes"):
            Bundle(wrong, loaded.variants, None, loaded.encoder_dir, loaded.votes)
    (tmp_path / "saved" / "manifest.json").write_text(
        json.dumps({**manifest, "vote_shapes": ["simplex"]})
    )
    with pytest.raises(InputError, match="1 vote shapes"):
        Bundle.load(tmp_path / "saved")


def test_the_format_version_is_7_exactly_when_a_vote_is_in_the_cube() -> None:
    from tests.service.fakes import tiny_bundle
    from training.pipeline import bundle_format_version

    bundle = tiny_bundle(vote=True, second_vote=True, by_count=True)
    table = bundle.manifest.p_table
    assert bundle_format_version(bundle.variants, table, bundle.votes) == 5
    cube = (bundle.votes[0], bundle.votes[1].shaped("cube"))
    assert bundle_format_version(bundle.variants, table, cube) == 7
    assert bundle_format_version(bundle.variants, table, [v.shaped("cube") for v in cube]) == 7


@pytest.mark.parametrize("classes", [2, 5, 13, FLIP_MAX_CLASSES, FLIP_MAX_CLASSES + 8])
def test_float_vote_probabilities_equal_the_exact_distribution(classes: int) -> None:
    """Training scores many documents at once in floats: each row equals the exact
    distribution (permute-and-flip's rational masses, the exponential mechanism above the
    flip limit, the count rule for short documents) to 1e-12, ties and far-behind classes
    included, and the leader need not be at deviation 0 in the input."""
    rng = np.random.default_rng(classes)
    deviations = rng.integers(0, 6 * VOTE_UNITS, size=(40, classes))
    deviations -= deviations.min(axis=1, keepdims=True)
    deviations[:4] = 0  # every class tied
    deviations[4:8, 1:] = 10**6  # one leader, the rest hopeless
    deviations[8:12] += 7  # a shifted row: the same distribution
    counts = [int(n) for n in rng.integers(1, 9, size=40)]
    for epsilon in (0.1, 1.0, 3.0, 50.0):
        for by_count in (False, True):
            fast = vote_probabilities(deviations, epsilon, counts if by_count else None)
            exact = np.stack(
                [
                    np.exp(vote_log_probs(d, epsilon, n if by_count else None))
                    for d, n in zip(deviations, counts, strict=True)
                ]
            )
            np.testing.assert_allclose(fast, exact, rtol=0, atol=1e-12)
    with pytest.raises(InputError):
        vote_probabilities(np.zeros((3, 1)), 1.0)
    with pytest.raises(InputError):
        vote_probabilities(-np.ones((3, 4)), 1.0)
    with pytest.raises(InputError):
        vote_probabilities(np.zeros((3, 4)), 1.0, [1, 2])
