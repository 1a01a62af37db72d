"""SentenceVote's training step: the per-sentence classifier and the per-epsilon choice."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import training.label_vote as label_vote_module
from sentdp.bundle import PChoice
from sentdp.errors import InputError
from sentdp.labels import SentenceVote
from training.embeddings import CorpusEmbeddings
from training.label_vote import train_vote, vote_macro_f1, with_label_choice
from training.vote_tables import limit_scores


def corpus(classes: int, documents: int = 60, seed: int = 0) -> tuple[CorpusEmbeddings, np.ndarray]:
    """Documents of 3 to 8 sentences near their class's centre (a few off-topic ones)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, 16)) * 2
    y = np.arange(documents) % classes
    rows, offsets = [], [0]
    for label in y:
        k = int(rng.integers(3, 9))
        sentences = centres[label] + rng.normal(size=(k, 16))
        sentences[0] = rng.normal(size=16) * 2  # an off-topic sentence
        rows.append(sentences)
        offsets.append(offsets[-1] + k)
    vectors = np.concatenate(rows).astype(np.float32)
    return CorpusEmbeddings(vectors, np.array(offsets), 0.0, True), y.astype(np.int64)


def test_the_vote_learns_the_classes_and_two_class_models_get_two_rows() -> None:
    for classes in (2, 4):
        embeddings, y = corpus(classes)
        train, validation = list(range(40)), list(range(40, 60))
        result = train_vote(embeddings, y, train, validation, (1.0, 50.0), seed=0)
        assert result.vote.classes == classes
        fits = [("sentences", c) for c in label_vote_module.REGULARISATION]
        fits += [("documents", c) for c in label_vote_module.DOCUMENT_REGULARISATION]
        assert all((f.fitted_on, f.regularisation) in fits for f in result.fits)
        scores = result.validation_macro_f1
        assert scores["50"] > 0.9  # clear classes, a large epsilon: nearly always right
        assert scores["1"] < scores["50"]
        documents = [embeddings.document(i) for i in validation]
        truth = list(y[validation])
        for epsilon in (1.0, 50.0):
            key = f"{epsilon:g}"
            vote = result.vote_at(epsilon)
            own = vote_macro_f1(vote, documents, truth, epsilon)
            assert own == result.fits[result.index_by_epsilon[key]].validation_macro_f1[key]
            # what runs there: the vote, and the hard-vote table up to the chosen limit
            limit = result.table_by_epsilon.get(key, 0)
            served = limit_scores(vote, [vote.logits(d) for d in documents], truth, epsilon)
            assert served[limit] == pytest.approx(scores[key], abs=1e-12)
            assert served[limit] == max(served)


def test_the_table_takes_the_vote_only_where_it_scored_higher() -> None:
    embeddings, y = corpus(3)
    result = train_vote(embeddings, y, list(range(40)), list(range(40, 60)), (1.0, 50.0), 0)
    table = [
        PChoice(epsilon=1.0, variant="paper", p=5, validation_macro_f1=0.0),
        PChoice(epsilon=50.0, variant="paper", p=5, validation_macro_f1=1.0),
    ]
    chosen = with_label_choice(table, result)
    assert [c.label for c in chosen] == ["vote", "candidate"]
    assert [c.vote_macro_f1 for c in chosen] == [
        result.validation_macro_f1["1"],
        result.validation_macro_f1["50"],
    ]
    assert [(c.variant, c.p) for c in chosen] == [("paper", 5), ("paper", 5)]
    assert [c.vote_index for c in chosen] == [result.index_by_epsilon[e] for e in ("1", "50")]
    # the table's limit goes with the vote, where the vote gives the label
    tabled = dataclasses.replace(
        result, table_by_epsilon={"1": 4, "50": 2}, table_macro_f1={"1": 0.9, "50": 0.95}
    )
    chosen = with_label_choice(table, tabled)
    assert [c.vote_table for c in chosen] == [4, 0]
    assert chosen[0].vote_macro_f1 == 0.9


def fit(scores: dict[str, float], name: float) -> label_vote_module.VoteFit:
    """A stand-in fit: ``name`` tells the fits apart (as its C)."""
    vote = SentenceVote(np.eye(2, 3) * name, np.zeros(2))
    return label_vote_module.VoteFit(vote, name, scores)


def test_an_epsilon_gets_a_vote_of_its_own_only_where_it_gains_enough() -> None:
    gain = label_vote_module.MIN_GAIN
    base = fit({"1": 0.50, "3": 0.70, "10": 0.90}, 1.0)  # best on average
    sharp = fit({"1": 0.50 + 2 * gain, "3": 0.70 + gain / 2, "10": 0.60}, 2.0)
    soft = fit({"1": 0.30, "3": 0.50, "10": 0.90 + gain}, 3.0)
    result = label_vote_module.choose_votes([sharp, base, soft])
    assert result.fits == (base, sharp, soft)
    # epsilon 3: sharp gains less than MIN_GAIN there, so vote 0 stays
    assert result.index_by_epsilon == {"1": 1, "3": 0, "10": 2}
    assert result.validation_macro_f1 == {"1": 0.50 + 2 * gain, "3": 0.70, "10": 0.90 + gain}
    only = label_vote_module.choose_votes([base, fit({"1": 0.5 + gain / 2, "3": 0, "10": 0}, 4)])
    assert only.fits == (base,)
    assert set(only.index_by_epsilon.values()) == {0}
    one_fit_wins_twice = fit({"1": 0.6, "3": 0.8, "10": 0.0}, 5.0)
    result = label_vote_module.choose_votes([base, one_fit_wins_twice])
    assert result.fits == (base, one_fit_wins_twice)  # stored once
    assert result.index_by_epsilon == {"1": 1, "3": 1, "10": 0}


def test_both_families_compete_on_validation(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Adding document-fitted classifiers never lowers the chosen vote's validation score, and
    a document-fitted winner is the logistic regression on document means over its temperature."""
    from sklearn.linear_model import LogisticRegression

    label_vote = label_vote_module
    embeddings, y = corpus(3, documents=90, seed=4)
    train, validation = list(range(60)), list(range(60, 90))
    both = train_vote(embeddings, y, train, validation, (1.0, 3.0), seed=0)
    monkeypatch.setattr(label_vote, "DOCUMENT_REGULARISATION", ())
    sentences_only = train_vote(embeddings, y, train, validation, (1.0, 3.0), seed=0)
    assert {f.fitted_on for f in sentences_only.fits} == {"sentences"}
    assert sentences_only.fits[0].regularisation in label_vote.REGULARISATION
    assert _mean_score(both) >= _mean_score(sentences_only)
    monkeypatch.setattr(label_vote, "REGULARISATION", ())
    monkeypatch.setattr(label_vote, "DOCUMENT_REGULARISATION", (100.0,))
    documents_only = train_vote(embeddings, y, train, validation, (1.0, 3.0), seed=0)
    assert {(f.fitted_on, f.regularisation) for f in documents_only.fits} == {("documents", 100.0)}
    model = LogisticRegression(C=100.0, max_iter=5000, random_state=0)
    model.fit(embeddings.means(train), y[train])
    t = documents_only.fits[0].temperature
    np.testing.assert_allclose(documents_only.vote.weights, model.coef_ / t)
    np.testing.assert_allclose(documents_only.vote.bias, model.intercept_ / t)


def _mean_score(result: label_vote_module.VoteResult) -> float:
    """Vote 0's mean over the grid: what the families compete on."""
    return float(np.mean(list(result.fits[0].validation_macro_f1.values())))


def test_a_class_without_training_documents_is_refused() -> None:
    embeddings, y = corpus(3)
    train = [i for i in range(40) if y[i] != 2]
    with pytest.raises(InputError, match=r"class \[2\]"):
        train_vote(embeddings, y, train, list(range(40, 60)), (1.0,), seed=0)


def test_votes_that_read_words_are_fitted_and_win_where_only_words_tell_classes_apart() -> None:
    from sentdp.errors import InternalError

    rng = np.random.default_rng(3)
    y = (np.arange(90) % 3).astype(np.int64)
    rows, offsets, texts = [], [0], []
    for label in y:
        k = int(rng.integers(3, 7))
        rows.append(rng.normal(size=(k, 16)))  # the embeddings carry nothing
        texts.append([f"about item{label} and word{rng.integers(40)}" for _ in range(k)])
        texts[-1][0] = "an off-topic sentence"
        offsets.append(offsets[-1] + k)
    embeddings = CorpusEmbeddings(
        np.concatenate(rows).astype(np.float32), np.array(offsets), 0.0, True
    )
    train, validation = list(range(60)), list(range(60, 90))
    result = train_vote(embeddings, y, train, validation, (1.0, 50.0), seed=0, texts=texts)
    assert result.vote.reads_words
    assert result.fits[0].fitted_on in ("words", "sentences+words", "documents+words")
    assert result.fits[0].word_regularisation in label_vote_module.WORD_REGULARISATION
    assert result.validation_macro_f1["50"] > 0.9
    documents = [embeddings.document(i) for i in validation]
    score = vote_macro_f1(
        result.vote_at(50.0), documents, list(y[validation]), 50.0, [texts[i] for i in validation]
    )
    assert score == result.validation_macro_f1["50"]  # scored as served: with the texts
    plain = train_vote(embeddings, y, train, validation, (1.0, 50.0), seed=0)
    assert not any(fit.vote.reads_words for fit in plain.fits)
    assert plain.validation_macro_f1["50"] < 0.7
    with pytest.raises(InternalError, match="line up"):
        train_vote(embeddings, y, train, validation, (1.0, 50.0), seed=0, texts=texts[:-1])
    # where no word recurs, the embedding families train alone instead of failing
    wordless = [["!" * (n + 1) for n in range(len(document))] for document in texts]
    alone = train_vote(embeddings, y, train, validation, (1.0, 50.0), seed=0, texts=wordless)
    assert not any(fit.vote.reads_words for fit in alone.fits)


def test_votes_by_count_are_scored_as_the_service_draws_them() -> None:
    """Training's validation score of a vote by count is its sentence-count distribution:
    higher than permute-and-flip's on one-sentence documents, the same on long ones."""
    embeddings, y = corpus(4)
    train, validation = list(range(40)), list(range(40, 60))
    result = train_vote(
        embeddings, y, train, validation, (1.0, 3.0), seed=0, by_count=True, shapes=("simplex",)
    )
    assert all(fit.vote.by_count for fit in result.fits)
    assert not train_vote(embeddings, y, train, validation, (1.0,), seed=0).vote.by_count
    vote = result.vote
    short = [embeddings.document(i)[1:2] for i in validation]  # one on-topic sentence each
    truth = [int(y[i]) for i in validation]
    counted = vote_macro_f1(vote, short, truth, 1.0)
    assert counted > vote_macro_f1(vote.counted(False), short, truth, 1.0) + 0.01
    long = [np.repeat(embeddings.document(i), 4, axis=0) for i in validation]  # 12+ sentences
    assert vote_macro_f1(vote, long, truth, 1.0) == vote_macro_f1(
        vote.counted(False), long, truth, 1.0
    )


def test_every_fit_votes_in_both_shapes_each_scored_as_it_is_drawn(
    tried_fits: list[label_vote_module.VoteFit],
) -> None:
    """Validation sees every (family, C, temperature) in the simplex (by count, when asked)
    and in the cube (never by count), each scored by its own distribution; with the simplex
    alone no cube vote is tried; an unknown shape is refused."""
    embeddings, y = corpus(4, seed=3)
    train, validation = list(range(40)), list(range(40, 60))
    seen = tried_fits
    train_vote(embeddings, y, train, validation, (1.0, 3.0), seed=0, by_count=True)
    calibrated = [f for f in seen if f.calibrated_at is not None]
    assert sorted(f.calibrated_at for f in calibrated) == [1.0, 3.0]
    assert all(f.vote.shape == "cube" and not f.vote.by_count for f in calibrated)
    seen[:] = [f for f in seen if f.calibrated_at is None]
    keys = {(f.fitted_on, f.regularisation, f.temperature) for f in seen}
    by_shape = {shape: [f for f in seen if f.vote.shape == shape] for shape in ("simplex", "cube")}
    for shape, fits in by_shape.items():
        assert {(f.fitted_on, f.regularisation, f.temperature) for f in fits} == keys
        assert all(f.vote.by_count == (shape == "simplex") for f in fits)
        assert all(f.describe()["shape"] == shape for f in fits)
    documents = [embeddings.document(i) for i in validation]
    truth = [int(y[i]) for i in validation]
    for fit in by_shape["cube"][:: len(keys) // 3]:
        assert fit.validation_macro_f1["1"] == vote_macro_f1(fit.vote, documents, truth, 1.0)
    differs = [
        c.validation_macro_f1 != s.validation_macro_f1
        for c, s in zip(by_shape["cube"], by_shape["simplex"], strict=True)
    ]
    assert sum(differs) > len(keys) // 2  # the shapes are really different votes
    seen.clear()
    train_vote(embeddings, y, train, validation, (1.0,), seed=0, shapes=("simplex",))
    assert seen
    assert all(f.vote.shape == "simplex" and f.calibrated_at is None for f in seen)
    with pytest.raises(InputError, match="vote shapes"):
        train_vote(embeddings, y, train, validation, (1.0,), seed=0, shapes=("sphere",))  # type: ignore[arg-type]
