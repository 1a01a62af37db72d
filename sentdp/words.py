"""A sentence's words as public features for SentenceVote: TF-IDF over a public vocabulary.

A vote may read its sentence's words as well as its embedding: a linear classifier on the
sentence's TF-IDF vector adds its logits to the embedding's. The vector is a function of the
sentence's own text and of public data only (the vocabulary and inverse document frequencies
fitted on public training sentences), so the vote stays a function of its own sentence and
the mechanism's sensitivity is unchanged.

The vector: lower-cased tokens of two or more word characters (the same rule as
scikit-learn's default ``token_pattern``); for each vocabulary word ``(1 + ln tf) * idf``;
scaled to unit Euclidean norm. Words outside the vocabulary are ignored; a sentence without
any vocabulary word has the zero vector (its word logits are 0).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp.errors import InputError

TOKENIZER = "lower-word2-v1"
"""Names the tokenizer below; a bundle records it, and a reader refuses another."""
_TOKEN = re.compile(r"(?u)\b\w\w+\b")

MAX_IDF = 100.0
"""Above any idf a corpus gives (ln of the number of sentences, plus 1); a larger one marks a
damaged bundle."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def tokens(sentence: str) -> list[str]:
    """The sentence's tokens: lower-cased runs of two or more word characters."""
    return _TOKEN.findall(sentence.lower())


@dataclass(frozen=True, eq=False)
class WordFeatures:
    """A public vocabulary and its inverse document frequencies (fitted on public sentences)."""

    vocabulary: tuple[str, ...]
    idf: FloatArray
    """(V,) float64 in [1, MAX_IDF] (``ln((1 + n) / (1 + df)) + 1`` is at least 1)."""
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        idf = np.asarray(self.idf)
        if idf.shape != (len(self.vocabulary),) or not self.vocabulary:
            raise InputError(
                f"word features need a vocabulary and one idf per word; got "
                f"{len(self.vocabulary)} words and idf of shape {idf.shape}"
            )
        if not (np.isfinite(idf).all() and (idf >= 1).all() and (idf <= MAX_IDF).all()):
            raise InputError(f"word idf values must lie in [1, {MAX_IDF:g}]")
        odd = [w for w in self.vocabulary if not isinstance(w, str) or tokens(w) != [w]]
        if odd:
            raise InputError(f"{len(odd)} vocabulary entries are not tokens, e.g. {odd[0]!r}")
        index = {word: n for n, word in enumerate(self.vocabulary)}
        if len(index) != len(self.vocabulary):
            raise InputError("the word vocabulary holds a word twice")
        object.__setattr__(self, "_index", index)

    @property
    def size(self) -> int:
        return len(self.vocabulary)

    def same_as(self, other: WordFeatures) -> bool:
        """Whether both give every sentence the same vector (same words, same idf)."""
        return self.vocabulary == other.vocabulary and np.array_equal(self.idf, other.idf)

    def vector(self, sentence: str) -> tuple[IntArray, FloatArray]:
        """The sentence's TF-IDF vector, sparse: word indices (ascending) and values."""
        index = self._index
        found = [index[t] for t in tokens(sentence) if t in index]
        indices, counts = np.unique(np.array(found, dtype=np.int64), return_counts=True)
        values = (1.0 + np.log(counts)) * self.idf[indices]
        if len(indices):
            values /= math.sqrt(math.fsum(values * values))
        return indices, values

    def matrix(self, sentences: Sequence[str]) -> Any:
        """(k, V) TF-IDF vectors as a SciPy CSR matrix, for fitting (training) only."""
        from scipy.sparse import csr_matrix

        pointers, columns, data = [0], [], []
        for sentence in sentences:
            indices, values = self.vector(sentence)
            columns.append(indices)
            data.append(values)
            pointers.append(pointers[-1] + len(indices))
        return csr_matrix(
            (
                np.concatenate([np.zeros(0), *data]),
                np.concatenate([np.zeros(0, int), *columns]),
                pointers,
            ),
            shape=(len(sentences), self.size),
        )

    def logits(self, sentences: Sequence[str], weights: FloatArray) -> FloatArray:
        """(k, r) ``vector(s) @ weights.T`` per sentence, each row computed from its sentence
        alone in a fixed order, so a row never depends on the other sentences (a sentence
        repeated within the call is computed once: a repeated long sentence costs its
        tokenization once, as the encoder encodes it once)."""
        out = np.zeros((len(sentences), weights.shape[0]))
        first: dict[str, int] = {}
        for row, sentence in enumerate(sentences):
            if sentence in first:
                out[row] = out[first[sentence]]
                continue
            first[sentence] = row
            indices, values = self.vector(sentence)
            if len(indices):
                out[row] = np.sum(weights[:, indices] * values, axis=1)
        return out


def fit_word_features(
    sentences: Sequence[str], min_count: int = 2, max_words: int = 50_000
) -> WordFeatures:
    """Vocabulary and idf from public training sentences: the words in at least ``min_count``
    of them (the ``max_words`` most frequent), ``idf = ln((1 + n) / (1 + df)) + 1``."""
    frequency: Counter[str] = Counter()
    for sentence in sentences:
        frequency.update(set(tokens(sentence)))
    kept = [(w, df) for w, df in frequency.items() if df >= min_count]
    kept.sort(key=lambda item: (-item[1], item[0]))
    kept = sorted(kept[:max_words])
    if not kept:
        raise InputError(f"no word occurs in {min_count} or more training sentences")
    n = len(sentences)
    idf = np.array([math.log((1 + n) / (1 + df)) + 1.0 for _, df in kept])
    return WordFeatures(tuple(w for w, _ in kept), idf)
