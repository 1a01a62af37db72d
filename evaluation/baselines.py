"""The paper's baselines, for evaluation only (neither training nor the service uses them).

* Truncation (Li and Clifton 2021, as in the paper): clip every sentence embedding to the
  central 75% interval of each dimension of public training document embeddings, average, add
  Laplace noise. One sentence moves the mean by at most ``w_j / k`` in dimension j, so the
  L1 sensitivity is ``sum_j w_j / k`` and each dimension gets Laplace noise of scale
  ``sum_j w_j / (k * epsilon)`` (the paper writes ``d * w / (k * epsilon)``: the same when the
  widths are equal, and never smaller in total).
* Word-level metric DP (Feyisetan et al. 2020): every word's GloVe vector gets noise with
  density proportional to ``exp(-epsilon * ||z||)`` (a uniform direction, a Gamma(n, 1/epsilon)
  length) and becomes the nearest word of a frequency-limited vocabulary. Words GloVe lacks
  all start from one point, the mean GloVe vector, and are randomised like the others:
  passing them through would publish exactly the rare words (names, numbers, typos) that
  identify a writer, and flatter the baseline. This is a weaker, word-level guarantee than
  SentDP at the same epsilon.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
_TOKEN = re.compile(r"\w+(?:'\w+)?|[^\w\s]")


@dataclass(frozen=True)
class TruncationBox:
    """Per-dimension clipping interval from public document embeddings."""

    low: FloatArray
    high: FloatArray

    @classmethod
    def from_public(cls, document_means: FloatArray, central: float = 0.75) -> TruncationBox:
        tail = (1.0 - central) / 2.0
        low, high = np.quantile(document_means, [tail, 1.0 - tail], axis=0)
        return cls(np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64))

    @property
    def widths(self) -> FloatArray:
        return self.high - self.low

    def clipped_mean(self, sentences: npt.ArrayLike) -> FloatArray:
        clipped = np.clip(np.asarray(sentences, dtype=np.float64), self.low, self.high)
        result: FloatArray = clipped.mean(axis=0)
        return result

    def privatize(
        self, sentences: npt.ArrayLike, epsilon: float, rng: np.random.Generator
    ) -> FloatArray:
        """epsilon-SentDP mean: clipped mean plus Laplace noise calibrated to its L1 sensitivity."""
        mean = self.clipped_mean(sentences)
        k = np.asarray(sentences).shape[0]
        scale = float(self.widths.sum()) / (k * epsilon)
        noisy: FloatArray = mean + rng.laplace(0.0, scale, size=mean.shape)
        return noisy


def tokenize_words(sentence: str) -> list[str]:
    """Lower-cased word and punctuation tokens, as GloVe's vocabulary spells them."""
    return _TOKEN.findall(sentence.lower())


class WordMetricDP:
    """Feyisetan et al.'s multivariate Laplace mechanism over GloVe, nearest-word decoding.

    ``vectors`` (V, n) and ``words`` (V,) are the embedding table; decoding searches only the
    ``output_vocabulary`` most frequent words. Every word absent from the table is embedded
    as the same vector, the table's mean, so all unknown words are indistinguishable from one
    another and each is randomised like a known word.
    """

    def __init__(self, vectors: npt.ArrayLike, words: list[str], output_vocabulary: int) -> None:
        table = np.asarray(vectors, dtype=np.float32)
        self.index = {w: i for i, w in enumerate(words)}
        self.table = table
        self.words = words
        self.output = np.ascontiguousarray(table[:output_vocabulary])
        self.output_norms = (self.output.astype(np.float64) ** 2).sum(axis=1)
        self.dim = table.shape[1]
        self.unknown: FloatArray = table.astype(np.float64).mean(axis=0)

    def vector(self, word: str) -> FloatArray:
        """The word's GloVe vector, or the shared unknown-word vector."""
        index = self.index.get(word)
        if index is None:
            return self.unknown
        result: FloatArray = self.table[index].astype(np.float64)
        return result

    def noise(self, count: int, epsilon: float, rng: np.random.Generator) -> FloatArray:
        direction = rng.standard_normal((count, self.dim))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        length = rng.gamma(shape=self.dim, scale=1.0 / epsilon, size=(count, 1))
        result: FloatArray = direction * length
        return result

    def randomize(
        self, sentences: list[str], epsilon: float, rng: np.random.Generator
    ) -> list[str]:
        """Every word replaced by the nearest vocabulary word to its noisy vector."""
        tokens = [tokenize_words(s) for s in sentences]
        places = [(i, j) for i, ts in enumerate(tokens) for j in range(len(ts))]
        if places:
            base = np.stack([self.vector(tokens[i][j]) for i, j in places])
            noisy = base + self.noise(len(places), epsilon, rng)
            scores = noisy.astype(np.float32) @ self.output.T  # (n, V)
            distances = self.output_norms[None, :] - 2.0 * scores
            nearest = np.argmin(distances, axis=1)
            for (i, j), word in zip(places, nearest, strict=True):
                tokens[i][j] = self.words[int(word)]
        return [" ".join(ts) if ts else s for ts, s in zip(tokens, sentences, strict=True)]


def random_guess_macro_f1(train_labels: npt.ArrayLike, n_classes: int) -> float:
    """The paper's random guesser: sum_i q_i^2 with q the training label frequencies."""
    counts = np.bincount(np.asarray(train_labels), minlength=n_classes)
    q = counts / counts.sum()
    return float((q**2).sum())
