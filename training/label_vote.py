"""The per-sentence classifier of SentenceVote, and where the vote beats the candidate's label.

Two families of linear per-sentence classifiers are fitted, and validation picks one:

- *sentence-fitted*: every training sentence labelled with its document's class (a weak
  label: a sports article also has sentences about money), a multinomial logistic regression
  on the sentences' G embeddings;
- *document-fitted*: a logistic regression on the training documents' mean G embeddings,
  applied to each sentence alone. Where a class shows in the document as a whole rather than
  in most of its sentences (a review's verdict), its weights read each sentence's share of
  that signal better (measured on movie-polarity validation at epsilon 1: 0.786 -> 0.817,
  C = 100 and temperature 4 against C = 0.1 and temperature 0.1).

Each family may also read the sentence's words: a logistic regression on the training
sentences' TF-IDF vectors (:mod:`sentdp.words`, vocabulary and idf from the public training
sentences) adds its logits to the embedding's, and on its own is a third family. Words see
what the embedding blurs (a product's name, a team's), and the sum of the two, each fitted
alone, beat either (measured on validation, clothing-reviews at epsilon 3: 0.358 with the
embedding alone, 0.378 with words alone, 0.389 with both).

Each fit votes in either shape (:data:`sentdp.labels.VOTE_SHAPES`): softmax votes in the
simplex, or votes in the cube that give a sentence's likeliest class all its units (measured
on clothing reviews' validation at epsilon 3, vote 0's fit: 0.383 -> 0.421; on BBC News and
movie-polarity within 0.002 of the simplex at every epsilon, and the simplex ahead from
epsilon 10 on clothing reviews). The shape is chosen with the rest.

The family, its regularisation, the shape and the votes' softmax temperature are chosen on
validation,
by the expected macro-F1 of the private vote (its probabilities, no sampling noise): vote 0
is the fit best on average over the grid's epsilons, and a grid epsilon where another fit
beats it by at least ``MIN_GAIN`` gets that fit as a vote of its own (small epsilons want
sharp votes, large ones soft: measured on validation, clothing-reviews 0.144 -> 0.163 at
epsilon 1, movie-polarity 0.817 -> 0.826). Every vote is a function of its own sentence, and
which one runs depends on the request's epsilon only, so the mechanism and its privacy are
unchanged. Then, per grid epsilon, the label of /classify comes from the vote or from
DeepCandidate's candidate, whichever has the higher expected validation macro-F1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp.bundle import PChoice
from sentdp.errors import InputError, InternalError
from sentdp.labels import (
    VOTE_SHAPES,
    SentenceVote,
    VoteShape,
    tally_deviations,
    vote_probabilities,
)
from sentdp.words import fit_word_features
from training.embeddings import CorpusEmbeddings
from training.p_selection import soft_macro_f1

REGULARISATION = (0.1, 1.0, 10.0)
"""Inverse regularisation strengths C tried for the sentence-fitted classifier."""
DOCUMENT_REGULARISATION = (10.0, 100.0, 1000.0)
"""C tried for the document-fitted classifier: few, averaged, examples want weak
regularisation (on movie-polarity validation C = 1 was 0.05 below C = 100)."""
TEMPERATURES = (8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.1)
"""Softmax temperatures tried for the votes. Below 1 a sentence's vote goes more wholly to
its likeliest class: more signal per sentence for the same sensitivity, which pays at small
epsilon (measured on validation at epsilon 1, exponential mechanism, temperatures 1 to 0.1:
movie-polarity 0.726 -> 0.775, clothing-reviews 0.117 -> 0.135). Above 1 for document-fitted
weights, whose logits on a single sentence are large."""

WORD_REGULARISATION = (1.0, 10.0)
"""C tried for the word classifier (on sentences' TF-IDF vectors, labelled with their
document's class), alone and added to each embedding fit."""

MIN_GAIN = 0.005
"""Expected validation macro-F1 a fit must gain at one epsilon over vote 0 to become that
epsilon's vote: the best of the fits (42 on embeddings alone, 140 with words, twice that
with both vote shapes) at one epsilon flatters validation a little more than the best on
average does, and a smaller gain is within that. Set when there were 42; with more fits the
flattery is larger, and the test figures of the reports are the check."""

MAX_SENTENCES = 60_000
"""Training sentences used at most (a seeded sample beyond): logistic regression on 384
dimensions learns little more from more weakly labelled sentences, and stays under a minute."""


@dataclass(frozen=True)
class VoteFit:
    """One fitted per-sentence classifier at one temperature, and how it scores."""

    vote: SentenceVote
    regularisation: float
    validation_macro_f1: dict[str, float]
    """Expected validation macro-F1 of the private vote, per grid epsilon."""
    temperature: float = 1.0
    """The softmax temperature of the votes (its weights and bias are divided by it)."""
    fitted_on: str = "sentences"
    """Its family: ``sentences``, ``documents`` or ``words`` (see the module); an embedding
    family that also reads words is ``sentences+words`` or ``documents+words``."""
    word_regularisation: float | None = None
    """C of its word classifier, if it reads words (``regularisation`` is the embedding
    classifier's, or the word classifier's for the ``words`` family)."""

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "fitted_on": self.fitted_on,
            "regularisation": self.regularisation,
            "temperature": self.temperature,
        }
        if self.word_regularisation is not None:
            described["word_regularisation"] = self.word_regularisation
        described["shape"] = self.vote.shape
        return described


@dataclass(frozen=True)
class VoteResult:
    """The votes a bundle stores, and which one runs at each grid epsilon."""

    fits: tuple[VoteFit, ...]
    """``fits[0]`` is best on average over the grid; the others each win some epsilon."""
    index_by_epsilon: dict[str, int]
    """Per grid epsilon (``f"{epsilon:g}"``), the index of its vote in ``fits``."""

    @property
    def votes(self) -> tuple[SentenceVote, ...]:
        return tuple(fit.vote for fit in self.fits)

    @property
    def vote(self) -> SentenceVote:
        return self.fits[0].vote

    @property
    def validation_macro_f1(self) -> dict[str, float]:
        """Expected validation macro-F1, per grid epsilon, of the vote that runs there."""
        return {e: self.fits[i].validation_macro_f1[e] for e, i in self.index_by_epsilon.items()}

    def vote_at(self, epsilon: float) -> SentenceVote:
        return self.fits[self.index_by_epsilon[f"{epsilon:g}"]].vote


def vote_macro_f1(
    vote: SentenceVote,
    documents: Sequence[npt.NDArray[np.floating]],
    truth: Sequence[int],
    epsilon: float,
    texts: Sequence[Sequence[str]] | None = None,
) -> float:
    """Macro-F1 of the expected confusion matrix of the private vote (its probabilities to
    about 1e-12, :func:`sentdp.labels.vote_probabilities`)."""
    return vote_scores(vote, documents, truth, [epsilon], texts)[f"{epsilon:g}"]


def vote_scores(
    vote: SentenceVote,
    documents: Sequence[npt.NDArray[np.floating]],
    truth: Sequence[int],
    epsilons: Sequence[float],
    texts: Sequence[Sequence[str]] | None = None,
) -> dict[str, float]:
    """:func:`vote_macro_f1` at every epsilon, the documents' votes counted once; ``texts``
    are the documents' sentences (needed by a vote that reads words)."""
    per_document = texts if texts is not None else [None] * len(documents)
    deviations = [
        vote.deviations(document, text)
        for document, text in zip(documents, per_document, strict=True)
    ]
    counts = [len(document) for document in documents]
    return deviation_scores(vote, deviations, counts, truth, epsilons)


def deviation_scores(
    vote: SentenceVote,
    deviations: Sequence[npt.NDArray[np.int64]],
    counts: Sequence[int],
    truth: Sequence[int],
    epsilons: Sequence[float],
) -> dict[str, float]:
    """:func:`vote_scores` from the documents' known deviations and sentence counts."""
    rows = np.asarray(truth, dtype=np.int64)
    counted = counts if vote.by_count else None
    scores = {}
    for epsilon in epsilons:
        confusion = np.zeros((vote.classes, vote.classes))
        np.add.at(confusion, rows, vote_probabilities(np.stack(deviations), epsilon, counted))
        scores[f"{epsilon:g}"] = soft_macro_f1(confusion)
    return scores


def train_vote(
    embeddings: CorpusEmbeddings,
    y: npt.NDArray[np.int64],
    train: Sequence[int],
    validation: Sequence[int],
    epsilons: Sequence[float],
    seed: int,
    texts: Sequence[Sequence[str]] | None = None,
    *,
    by_count: bool = False,
    shapes: Sequence[VoteShape] = VOTE_SHAPES,
) -> VoteResult:
    """Fit every family of per-sentence classifier; choose family, C and temperature on
    validation, for the grid as a whole and, where it gains ``MIN_GAIN``, per epsilon.
    ``texts`` (every document's sentences, aligned with ``embeddings``) adds the families
    that read words; without it only the embedding families are fitted. ``by_count``: the
    simplex votes are drawn by the sentence-count rule, and validation scores them that way;
    ``shapes``: the vote shapes tried for every fit."""
    from sklearn.linear_model import LogisticRegression

    if not shapes or any(shape not in VOTE_SHAPES for shape in shapes):
        raise InputError(f"vote shapes are a non-empty choice of {VOTE_SHAPES}, got {shapes}")
    missing = sorted(set(range(int(y.max()) + 1)) - {int(y[i]) for i in train})
    if missing:
        raise InputError(
            f"SentenceVote needs a training document of every class; none of class {missing}"
        )
    rows = np.concatenate(
        [np.arange(embeddings.offsets[i], embeddings.offsets[i + 1]) for i in train]
    )
    labels = np.concatenate(
        [np.full(embeddings.offsets[i + 1] - embeddings.offsets[i], y[i]) for i in train]
    )
    if len(rows) > MAX_SENTENCES:
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), MAX_SENTENCES, replace=False))
        rows, labels = rows[keep], labels[keep]
    x = embeddings.vectors[rows].astype(np.float64)
    documents = [embeddings.document(i) for i in validation]
    truth = [int(y[i]) for i in validation]
    fits = [("sentences", c, x, labels, 500) for c in REGULARISATION]
    means = embeddings.means(list(train))
    fits += [("documents", c, means, y[list(train)], 5000) for c in DOCUMENT_REGULARISATION]
    base: list[tuple[str, float, float | None, SentenceVote]] = []
    for family, strength, inputs, targets, iterations in fits:
        model = LogisticRegression(C=strength, max_iter=iterations, random_state=seed)
        model.fit(inputs, targets)
        assert list(model.classes_) == list(range(len(model.classes_)))
        base.append((family, strength, None, _as_vote(model.coef_, model.intercept_)))
    validation_texts = None
    if texts is not None:
        flat = _aligned_sentences(embeddings, texts)
        validation_texts = [texts[i] for i in validation]
        embedding_fits = list(base)
        for strength, word_vote in _word_votes(flat[rows], labels, x.shape[1], seed):
            base.append(("words", strength, strength, word_vote))
            for family, c, _, vote in embedding_fits:
                # a product of the two classifiers' probabilities: both intercepts count the
                # class prior, which validation weighs like any other difference between fits
                combined = SentenceVote(
                    vote.weights,
                    vote.bias + word_vote.bias,
                    word_vote.word_weights,
                    word_vote.words,
                )
                base.append((f"{family}+words", c, strength, combined))
    tried: list[VoteFit] = []
    per_document: Sequence[Sequence[str] | None] = (
        validation_texts if validation_texts is not None else [None] * len(documents)
    )
    counts = [len(document) for document in documents]
    for family, strength, word_strength, fitted in base:
        for temperature in TEMPERATURES:
            scaled = fitted.scaled(temperature).counted(by_count)
            logits = [  # computed once for both shapes: the shape does not change them
                scaled.logits(document, text)
                for document, text in zip(documents, per_document, strict=True)
            ]
            for shape in shapes:
                vote = scaled.shaped(shape)
                deviations = [tally_deviations(vote.votes_from_logits(x)) for x in logits]
                scores = deviation_scores(vote, deviations, counts, truth, epsilons)
                tried.append(VoteFit(vote, strength, scores, temperature, family, word_strength))
    return choose_votes(tried)


def _aligned_sentences(
    embeddings: CorpusEmbeddings, texts: Sequence[Sequence[str]]
) -> npt.NDArray[np.object_]:
    """Every sentence's text, in the rows of ``embeddings`` (checked to line up)."""
    counts = np.diff(embeddings.offsets)
    if len(texts) != len(counts) or any(len(t) != n for t, n in zip(texts, counts, strict=True)):
        raise InternalError("the documents' sentences do not line up with their embeddings")
    flat = np.empty(int(counts.sum()), dtype=object)
    flat[:] = [sentence for document in texts for sentence in document]
    return flat


def _word_votes(
    sentences: npt.NDArray[np.object_], labels: npt.NDArray[np.int64], dims: int, seed: int
) -> list[tuple[float, SentenceVote]]:
    """Per ``WORD_REGULARISATION``, a vote of the word classifier alone (zero embedding
    weights), fitted on the training sentences' TF-IDF vectors over their own vocabulary;
    none where no word recurs (text without word characters, or without spaces between
    words), so that such a corpus trains the embedding families alone."""
    from sklearn.linear_model import LogisticRegression

    texts = list(sentences)
    try:
        words = fit_word_features(texts)
    except InputError:
        return []
    features = words.matrix(texts)
    made = []
    for strength in WORD_REGULARISATION:
        model = LogisticRegression(C=strength, max_iter=1000, random_state=seed)
        model.fit(features, labels)
        assert list(model.classes_) == list(range(len(model.classes_)))
        fitted = _as_vote(model.coef_, model.intercept_)
        zero = np.zeros((fitted.classes, dims))
        made.append((strength, SentenceVote(zero, fitted.bias, fitted.weights, words)))
    return made


def choose_votes(tried: Sequence[VoteFit]) -> VoteResult:
    """Vote 0: the fit best on average over the grid (the first of equals); then, per grid
    epsilon, the fit best there if it beats vote 0 there by ``MIN_GAIN`` (kept once however
    many epsilons it wins)."""
    if not tried:
        raise InputError("no vote was fitted")
    base = max(tried, key=lambda fit: float(np.mean(list(fit.validation_macro_f1.values()))))
    chosen = [base]
    index_by_epsilon = {}
    for key, score in base.validation_macro_f1.items():
        best = max(tried, key=lambda fit: fit.validation_macro_f1[key])
        if best.validation_macro_f1[key] < score + MIN_GAIN:
            best = base
        if not any(best is fit for fit in chosen):
            chosen.append(best)
        index_by_epsilon[key] = next(i for i, fit in enumerate(chosen) if fit is best)
    return VoteResult(tuple(chosen), index_by_epsilon)


def _as_vote(coef: npt.NDArray[np.floating], intercept: npt.NDArray[np.floating]) -> SentenceVote:
    """sklearn's two-class model has one row (the logit of class 1 over class 0): as a softmax
    over two rows it is ``[0, w]``."""
    weights, bias = coef.astype(np.float64), intercept.astype(np.float64)
    if weights.shape[0] == 1:
        weights = np.vstack([np.zeros_like(weights), weights])
        bias = np.concatenate([np.zeros(1), bias])
    return SentenceVote(weights, bias)


def with_label_choice(p_table: Sequence[PChoice], vote: VoteResult) -> list[PChoice]:
    """The p table with, per epsilon, the label source of higher expected validation macro-F1
    (the candidate's on ties: it costs nothing extra). Both sides are maxima over choices
    made on the same validation split (the vote's over all its fits at that epsilon, the
    candidate's over variants and p): both are flattered, the vote somewhat more."""
    chosen = []
    for choice in p_table:
        key = f"{choice.epsilon:g}"
        score = vote.validation_macro_f1[key]
        better = choice.validation_macro_f1 is None or score > choice.validation_macro_f1
        update = {
            "label": "vote" if better else "candidate",
            "vote_macro_f1": score,
            "vote_index": vote.index_by_epsilon[key],
        }
        chosen.append(choice.model_copy(update=update))
    return chosen
