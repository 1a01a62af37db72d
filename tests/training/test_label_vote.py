"""SentenceVote's training step: the per-sentence classifier and the per-epsilon choice."""

from __future__ import annotations

import numpy as np
import pytest

import training.label_vote as label_vote_module
from sentdp.bundle import PChoice
from sentdp.errors import InputError
from training.embeddings import CorpusEmbeddings
from training.label_vote import train_vote, vote_macro_f1, with_label_choice


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
        assert (result.fitted_on, result.regularisation) in fits
        scores = result.validation_macro_f1
        assert scores["50"] > 0.9  # clear classes, a large epsilon: nearly always right
        assert scores["1"] < scores["50"]
        documents = [embeddings.document(i) for i in validation]
        assert vote_macro_f1(result.vote, documents, list(y[validation]), 50.0) == scores["50"]


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
    assert sentences_only.fitted_on == "sentences"
    assert sentences_only.regularisation in label_vote.REGULARISATION
    assert _mean_score(both) >= _mean_score(sentences_only)
    monkeypatch.setattr(label_vote, "REGULARISATION", ())
    monkeypatch.setattr(label_vote, "DOCUMENT_REGULARISATION", (100.0,))
    documents_only = train_vote(embeddings, y, train, validation, (1.0, 3.0), seed=0)
    assert (documents_only.fitted_on, documents_only.regularisation) == ("documents", 100.0)
    model = LogisticRegression(C=100.0, max_iter=5000, random_state=0)
    model.fit(embeddings.means(train), y[train])
    t = documents_only.temperature
    np.testing.assert_allclose(documents_only.vote.weights, model.coef_ / t)
    np.testing.assert_allclose(documents_only.vote.bias, model.intercept_ / t)


def _mean_score(result: label_vote_module.VoteResult) -> float:
    return float(np.mean(list(result.validation_macro_f1.values())))


def test_a_class_without_training_documents_is_refused() -> None:
    embeddings, y = corpus(3)
    train = [i for i in range(40) if y[i] != 2]
    with pytest.raises(InputError, match=r"class \[2\]"):
        train_vote(embeddings, y, train, list(range(40, 60)), (1.0,), seed=0)
