"""A sentence's words as public features: the tokenizer, TF-IDF vectors equal to
scikit-learn's, and logits that depend on their own sentence only."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sentdp.errors import InputError
from sentdp.words import WordFeatures, fit_word_features, tokens

TRAINING = [
    "The dress fits true to size.",
    "Love this dress, the colour is lovely!",
    "These jeans run small; size up.",
    "The jeans are soft and the colour holds.",
    "Soft fabric, great fit, love it.",
    "Runs small in the shoulders.",
    "Élégante robe, très jolie.",
]


def test_tokens_are_lower_cased_runs_of_two_or_more_word_characters() -> None:
    assert tokens("I LOVE it -- 10/10, don't!") == ["love", "it", "10", "10", "don"]
    assert tokens("Élégante robe") == ["élégante", "robe"]
    assert tokens("a . ,") == []


def test_vectors_equal_scikit_learn_s_sublinear_tfidf() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer

    words = fit_word_features(TRAINING)
    reference = TfidfVectorizer(
        tokenizer=tokens, lowercase=False, token_pattern=None, sublinear_tf=True, min_df=2
    )
    expected = reference.fit_transform(TRAINING).toarray()
    assert list(words.vocabulary) == reference.get_feature_names_out().tolist()
    assert np.allclose(words.idf, reference.idf_, rtol=1e-15, atol=0)
    got = words.matrix(TRAINING).toarray()
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-15)
    assert np.allclose(
        words.matrix(["love love love the dress"]).toarray(),
        reference.transform(["love love love the dress"]).toarray(),
        atol=1e-15,
    )


def test_a_vector_is_unit_or_zero_and_ignores_unknown_words() -> None:
    words = fit_word_features(TRAINING)
    indices, values = words.vector("dress dress dress zzz the")
    assert list(indices) == sorted(indices)
    assert math.isclose(float(np.sum(values**2)), 1.0, rel_tol=1e-15)
    dress, the = words.vocabulary.index("dress"), words.vocabulary.index("the")
    ratio = values[list(indices).index(dress)] / values[list(indices).index(the)]
    assert math.isclose(ratio, (1 + math.log(3)) * words.idf[dress] / words.idf[the])
    empty, nothing = words.vector("zzz qqq!")
    assert len(empty) == 0
    assert len(nothing) == 0
    weights = np.random.default_rng(0).normal(size=(3, words.size))
    assert np.array_equal(words.logits(["zzz qqq!"], weights), np.zeros((1, 3)))


def test_each_sentence_s_logits_depend_on_that_sentence_alone() -> None:
    words = fit_word_features(TRAINING)
    weights = np.random.default_rng(1).normal(size=(5, words.size)) * 7
    sentences = TRAINING * 10
    logits = words.logits(sentences, weights)
    for n in (1, 3, 8, 64):
        assert np.array_equal(words.logits(sentences[:n], weights), logits[:n])
    assert np.array_equal(words.logits(sentences[::-1], weights)[::-1], logits)


def test_malformed_vocabularies_are_refused() -> None:
    with pytest.raises(InputError):
        WordFeatures(("a", "b"), np.ones(3))
    with pytest.raises(InputError):
        WordFeatures(("a", "a"), np.ones(2))
    with pytest.raises(InputError):
        WordFeatures(("a", "b"), np.array([1.0, np.nan]))
    with pytest.raises(InputError):
        WordFeatures(("a", "b"), np.array([1.0, 0.0]))
    with pytest.raises(InputError):
        fit_word_features(["one sentence only"])
