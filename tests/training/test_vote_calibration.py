"""Votes calibrated through the mechanism: out-of-fold logits, the per-class fit, and the
calibrated vote being an ordinary vote of one sentence."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

import training.label_vote as label_vote_module
from sentdp.labels import VOTE_UNITS, SentenceVote, vote_probabilities
from sentdp.words import fit_word_features
from training.embeddings import CorpusEmbeddings
from training.label_vote import train_vote, vote_macro_f1
from training.vote_calibration import (
    FOLDS,
    FoldLogits,
    _selection,
    _soft_macro_f1,
    calibrate,
    calibrated,
    out_of_fold_logits,
)


def uneven_corpus(
    documents: int = 120, seed: int = 0
) -> tuple[CorpusEmbeddings, np.ndarray, SentenceVote]:
    """Three classes, documents of 2 to 6 sentences; class 0's sentences sit far from the
    others, classes 1 and 2 close together, and most sentences are noise: one temperature
    suits no class well. Also a vote fitted on them."""
    rng = np.random.default_rng(seed)
    centres = np.array([[4.0, 0, 0, 0], [0, 0.6, 0, 0], [0, -0.6, 0, 0]])
    y = np.arange(documents) % 3
    rows, offsets = [], [0]
    for label in y:
        k = int(rng.integers(2, 7))
        rows.append(centres[label] * (rng.random((k, 1)) < 0.5) + rng.normal(size=(k, 4)))
        offsets.append(offsets[-1] + k)
    embeddings = CorpusEmbeddings(
        np.concatenate(rows).astype(np.float32), np.array(offsets), 0.0, True
    )
    vote = SentenceVote(centres.copy(), np.zeros(3))
    return embeddings, y.astype(np.int64), vote


def criterion(fold: FoldLogits, scale: np.ndarray, offset: np.ndarray, epsilon: float) -> float:
    """The calibration's objective at (scale, offset), computed through the exact vote
    (:func:`vote_probabilities` of the floored integer votes)."""
    shifted = fold.logits * scale + offset
    votes = np.floor(np.exp(shifted - shifted.max(axis=1, keepdims=True)) * VOTE_UNITS)
    tallies = np.zeros((len(fold.truth), fold.logits.shape[1]))
    np.add.at(tallies, fold.segments, votes)
    probabilities = vote_probabilities(tallies.max(axis=1, keepdims=True) - tallies, epsilon)
    confusion = np.zeros((3, 3))
    np.add.at(confusion, fold.truth, probabilities)
    return float(_soft_macro_f1(torch.as_tensor(confusion)))


def test_every_training_document_gets_logits_from_a_fit_that_did_not_see_it() -> None:
    embeddings, y, vote = uneven_corpus()
    train = list(range(0, 120, 2))
    seen: list[set[int]] = []

    def fit_on(documents: Sequence[int]) -> SentenceVote:
        seen.append(set(documents))
        return SentenceVote(vote.weights * len(seen), vote.bias)  # which fit scored a row

    fold = out_of_fold_logits(fit_on, embeddings, y, train, seed=0)
    assert len(seen) == FOLDS
    assert sorted(set.union(*seen)) == train  # every fit leaves exactly one fold out
    assert sum(len(s) for s in seen) == (FOLDS - 1) * len(train)
    assert list(fold.truth) == [int(y[i]) for i in train]
    assert len(fold.logits) == sum(len(embeddings.document(i)) for i in train)
    for index, document in enumerate(train):
        assert sum(document not in s for s in seen) == 1  # left out by exactly one fit
        rows = fold.logits[fold.segments == index]
        fit = next(k for k, s in enumerate(seen, start=1) if document not in s)
        expected = embeddings.document(document).astype(np.float64) @ vote.weights.T * fit
        np.testing.assert_allclose(rows, expected, rtol=1e-12)


def test_folds_are_stratified_so_every_fit_sees_every_class_with_two_documents() -> None:
    embeddings, y, vote = uneven_corpus()
    train = [0, 3, *range(1, 120, 3), *range(2, 120, 3)]  # class 0: documents 0 and 3 only
    seen: list[set[int]] = []

    def fit_on(documents: Sequence[int]) -> SentenceVote:
        seen.append(set(documents))
        return vote

    out_of_fold_logits(fit_on, embeddings, y, train, seed=5)
    assert all({int(y[i]) for i in documents} == {0, 1, 2} for documents in seen)


def test_a_class_with_one_training_document_trains_without_calibration(
    tried_fits: list[label_vote_module.VoteFit],
) -> None:
    embeddings, y, _ = uneven_corpus()
    train = [0, *range(1, 100, 3), *range(2, 100, 3)]
    seen = tried_fits
    train_vote(embeddings, y, train, list(range(100, 120)), (1.0,), seed=0)
    assert seen
    assert all(f.calibrated_at is None for f in seen)


def test_the_torch_selection_is_the_served_vote_distribution() -> None:
    """For integer tallies the differentiable probabilities equal the vote's own (floor
    included), under permute-and-flip and, above 32 classes, the exponential mechanism."""
    rng = np.random.default_rng(1)
    for classes in (2, 5, 13, 40):
        tallies = rng.integers(0, 6 * VOTE_UNITS, size=(50, classes)).astype(np.float64)
        tallies[0] = tallies[0, 0]  # all tied
        deviations = tallies.max(axis=1, keepdims=True) - tallies
        for epsilon in (0.5, 3.0, 23.0):
            ours = _selection(epsilon, classes)(torch.as_tensor(tallies / VOTE_UNITS))
            expected = vote_probabilities(deviations.astype(np.int64), epsilon)
            np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-9, atol=1e-15)


def test_calibration_raises_what_validation_scores_on_its_own_logits() -> None:
    embeddings, y, vote = uneven_corpus()
    train = list(range(120))
    fold = out_of_fold_logits(lambda _: vote, embeddings, y, train, seed=0)
    for epsilon in (1.0, 3.0):
        start = criterion(fold, np.ones(3), np.zeros(3), epsilon)
        scale, offset = calibrate(fold, 1.0, epsilon)
        assert scale.shape == offset.shape == (3,)
        assert not np.allclose(scale, scale[0])  # a scale of its own per class
        assert criterion(fold, scale, offset, epsilon) > start + 0.01


def test_a_calibrated_vote_is_its_fit_scaled_and_shifted_per_class_in_the_cube() -> None:
    rng = np.random.default_rng(2)
    texts = ["red shoes fit", "blue shoes", "red dress fits well", "a dress", "shoes", "red"] * 2
    words = fit_word_features(texts)
    base = SentenceVote(
        rng.normal(size=(3, 4)),
        rng.normal(size=3),
        rng.normal(size=(3, words.size)),
        words,
        shape="simplex",
    )
    scale, offset = np.array([0.5, 2.0, 1.0]), np.array([0.0, -1.0, 3.0])
    vote = calibrated(base, scale, offset)
    assert vote.shape == "cube"
    assert not vote.by_count
    assert vote.words is words
    x = rng.normal(size=(len(texts), 4))
    np.testing.assert_allclose(
        vote.logits(x, texts), base.logits(x, texts) * scale + offset, rtol=1e-12
    )
    # each sentence's vote is still a function of that sentence alone
    np.testing.assert_array_equal(vote.votes(x, texts)[3], vote.votes(x[3:4], texts[3:4])[0])


def test_training_scores_each_calibrated_vote_as_it_is_drawn(
    tried_fits: list[label_vote_module.VoteFit],
) -> None:
    """One calibrated cube fit per grid epsilon, started from the cube fit best there, scored
    by its own distribution; the result may choose it like any other."""
    embeddings, y, _ = uneven_corpus(documents=150, seed=4)
    train, validation = list(range(100)), list(range(100, 150))
    seen = tried_fits
    train_vote(embeddings, y, train, validation, (1.0, 3.0), seed=0)
    documents = [embeddings.document(i) for i in validation]
    truth = [int(y[i]) for i in validation]
    calibrated_fits = [f for f in seen if f.calibrated_at is not None]
    assert [f.calibrated_at for f in calibrated_fits] == [1.0, 3.0]
    for fit in calibrated_fits:
        key = f"{fit.calibrated_at:g}"
        start = max(
            (f for f in seen if f.calibrated_at is None and f.vote.shape == "cube"),
            key=lambda f: f.validation_macro_f1[key],
        )
        assert (fit.fitted_on, fit.regularisation, fit.temperature) == (
            start.fitted_on,
            start.regularisation,
            start.temperature,
        )
        assert fit.describe()["calibrated_at"] == fit.calibrated_at
        assert not fit.vote.same_as(start.vote)
        # the calibration of that fit's own out-of-fold logits, at this epsilon
        families = label_vote_module._Families(embeddings, y, 0, None, train)
        family = (start.fitted_on, start.regularisation, start.word_regularisation)
        fold = out_of_fold_logits(families.fitter(*family), embeddings, y, train, 0)
        scale, offset = calibrate(fold, start.temperature, fit.calibrated_at)  # type: ignore[arg-type]
        unscaled = families.fitter(*family)(train)
        assert fit.vote.same_as(calibrated(unscaled, scale, offset))
        for epsilon in (1.0, 3.0):
            expected = vote_macro_f1(fit.vote, documents, truth, epsilon)
            assert fit.validation_macro_f1[f"{epsilon:g}"] == pytest.approx(expected, abs=0)


def test_a_folds_word_vote_knows_no_word_of_the_fold_it_scores() -> None:
    """Each document has a word of its own (used in two of its sentences, so it enters a
    vocabulary), and every document the word "shared". The vocabulary of the votes is fitted
    on all training sentences; a fold's fit must use only its own documents' words, or the
    out-of-fold logits would see words, and idf, from the documents they score."""
    embeddings, y, _ = uneven_corpus()
    counts = np.diff(embeddings.offsets)
    texts = [
        [f"shared own{i} text" if s < 2 else "shared filler" for s in range(int(n))]
        for i, n in enumerate(counts)
    ]
    train = list(range(0, 120, 2))
    families = label_vote_module._Families(embeddings, y, 0, texts, train)
    assert families.words is not None
    assert {f"own{i}" for i in train} <= set(families.words.vocabulary)
    fitted: list[tuple[set[int], SentenceVote]] = []
    fit = families.fitter("words", 1.0, 1.0)

    def fit_on(documents: Sequence[int]) -> SentenceVote:
        vote = fit(documents)
        fitted.append((set(documents), vote))
        return vote

    fold = out_of_fold_logits(fit_on, embeddings, y, train, 0, texts)
    assert len(fitted) == FOLDS
    for documents, vote in fitted:
        assert vote.words is not None
        own = {w for w in vote.words.vocabulary if w.startswith("own")}
        assert own == {f"own{i}" for i in documents}  # its own documents' words, and no other
        assert vote.words.idf[vote.words.vocabulary.index("shared")] == 1.0  # in every sentence
    assert fold.logits.shape == (int(counts[train].sum()), 3)
    full = families.fitter("words", 1.0, 1.0)(train)
    assert full.words is families.words  # the votes themselves keep the whole vocabulary
