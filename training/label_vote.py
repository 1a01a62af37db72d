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

Then, per grid epsilon, the cube fit best there is calibrated through the mechanism at that
epsilon (:mod:`training.vote_calibration`: a scale and an offset per class, fitted for the
private vote's expected macro-F1 on out-of-fold votes of the training documents; clothing
reviews' served votes at epsilon 1 / 3, expected validation macro-F1 0.194 / 0.422 -> 0.194 /
0.442, test 0.192 / 0.411 -> 0.192 / 0.430), and the calibrated fits join those validation
chooses from.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
from sentdp.vote_table import MOST_CLASSES
from sentdp.words import WordFeatures, fit_word_features
from training.embeddings import CorpusEmbeddings
from training.p_selection import soft_macro_f1
from training.vote_calibration import calibrate, calibrated, out_of_fold_logits
from training.vote_tables import choose_limit, limit_scores

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
    calibrated_at: float | None = None
    """The epsilon its logits were calibrated through the mechanism at
    (:mod:`training.vote_calibration`; ``temperature`` is then the one it started from)."""

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "fitted_on": self.fitted_on,
            "regularisation": self.regularisation,
            "temperature": self.temperature,
        }
        if self.word_regularisation is not None:
            described["word_regularisation"] = self.word_regularisation
        described["shape"] = self.vote.shape
        if self.calibrated_at is not None:
            described["calibrated_at"] = self.calibrated_at
        return described


@dataclass(frozen=True)
class VoteResult:
    """The votes a bundle stores, and which one runs at each grid epsilon."""

    fits: tuple[VoteFit, ...]
    """``fits[0]`` is best on average over the grid; the others each win some epsilon."""
    index_by_epsilon: dict[str, int]
    """Per grid epsilon (``f"{epsilon:g}"``), the index of its vote in ``fits``."""
    table_by_epsilon: dict[str, int] = field(default_factory=dict)
    """Per grid epsilon where validation chose one, the limit N of the hard-vote table
    (:mod:`training.vote_tables`); absent: 0, none."""
    table_macro_f1: dict[str, float] = field(default_factory=dict)
    """Expected validation macro-F1 with that limit, per epsilon of ``table_by_epsilon``."""

    @property
    def votes(self) -> tuple[SentenceVote, ...]:
        return tuple(fit.vote for fit in self.fits)

    @property
    def vote(self) -> SentenceVote:
        return self.fits[0].vote

    @property
    def validation_macro_f1(self) -> dict[str, float]:
        """Expected validation macro-F1, per grid epsilon, of the vote that runs there (and
        the table for short documents, where chosen)."""
        return {
            e: self.table_macro_f1.get(e, self.fits[i].validation_macro_f1[e])
            for e, i in self.index_by_epsilon.items()
        }

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
    if not shapes or any(shape not in VOTE_SHAPES for shape in shapes):
        raise InputError(f"vote shapes are a non-empty choice of {VOTE_SHAPES}, got {shapes}")
    missing = sorted(set(range(int(y.max()) + 1)) - {int(y[i]) for i in train})
    if missing:
        raise InputError(
            f"SentenceVote needs a training document of every class; none of class {missing}"
        )
    families = _Families(embeddings, y, seed, texts, train)
    documents = [embeddings.document(i) for i in validation]
    truth = [int(y[i]) for i in validation]
    embedding_fits = [("sentences", c) for c in REGULARISATION]
    embedding_fits += [("documents", c) for c in DOCUMENT_REGULARISATION]
    base: list[tuple[str, float, float | None, SentenceVote]] = [
        (family, c, None, families.embedding_vote(family, c, train)) for family, c in embedding_fits
    ]
    validation_texts = None
    if families.words is not None:
        validation_texts = [texts[i] for i in validation] if texts is not None else None
        embedding_votes = list(base)
        for strength in WORD_REGULARISATION:
            word_vote = families.word_vote(strength, train)
            base.append(("words", strength, strength, word_vote))
            for family, c, _, vote in embedding_votes:
                base.append((f"{family}+words", c, strength, _combined(vote, word_vote)))
    tried: list[VoteFit] = []
    per_document: Sequence[Sequence[str] | None] = (
        validation_texts if validation_texts is not None else [None] * len(documents)
    )
    counts = [len(document) for document in documents]

    def scored(vote: SentenceVote) -> dict[str, float]:
        deviations = [
            vote.deviations(document, text)
            for document, text in zip(documents, per_document, strict=True)
        ]
        return deviation_scores(vote, deviations, counts, truth, epsilons)

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
    if "cube" in shapes:
        unscaled = {(family, c, word_c): vote for family, c, word_c, vote in base}
        for fit, vote in _calibrated(tried, unscaled, families, train, epsilons):
            tried.append(replace(fit, vote=vote, validation_macro_f1=scored(vote)))
    return with_tables(choose_votes(tried), documents, per_document, truth, epsilons)


def with_tables(
    result: VoteResult,
    documents: Sequence[npt.NDArray[np.floating]],
    texts: Sequence[Sequence[str] | None],
    truth: Sequence[int],
    epsilons: Sequence[float],
) -> VoteResult:
    """``result`` with, per grid epsilon, the limit N of the hard-vote table validation
    chooses for its vote (:mod:`training.vote_tables`); none for more classes than a table
    is made for."""
    limits: dict[str, int] = {}
    scores: dict[str, float] = {}
    logits: dict[int, list[npt.NDArray[np.float64]]] = {}
    for epsilon in epsilons:
        key = f"{epsilon:g}"
        index = result.index_by_epsilon[key]
        vote = result.fits[index].vote
        if vote.classes > MOST_CLASSES:
            continue
        if index not in logits:
            logits[index] = [
                vote.logits(document, text) for document, text in zip(documents, texts, strict=True)
            ]
        by_limit = limit_scores(vote, logits[index], truth, epsilon)
        limit = choose_limit(by_limit)
        if limit:
            limits[key], scores[key] = limit, by_limit[limit]
    return replace(result, table_by_epsilon=limits, table_macro_f1=scores)


def _calibrated(
    tried: Sequence[VoteFit],
    unscaled: dict[tuple[str, float, float | None], SentenceVote],
    families: _Families,
    train: Sequence[int],
    epsilons: Sequence[float],
) -> list[tuple[VoteFit, SentenceVote]]:
    """Per grid epsilon, the cube fit best on validation there, calibrated through the
    mechanism at that epsilon (:mod:`training.vote_calibration`), as ``(fit, vote)``: the fit
    describes it (its scores are the uncalibrated fit's until the caller scores the vote).
    A family's out-of-fold logits are computed once however many epsilons start from it.
    None where a class has fewer than two training documents."""
    if min(np.bincount(families.y[list(train)])) < 2:
        return []  # a class with one training document would be missing from a fold's fit
    cube = [fit for fit in tried if fit.vote.shape == "cube"]
    folds = {}
    made = []
    for epsilon in epsilons:
        start = max(cube, key=lambda fit: fit.validation_macro_f1[f"{epsilon:g}"])
        key = (start.fitted_on, start.regularisation, start.word_regularisation)
        if key not in folds:
            folds[key] = out_of_fold_logits(
                families.fitter(*key),
                families.embeddings,
                families.y,
                train,
                families.seed,
                families.texts,
            )
        scale, offset = calibrate(folds[key], start.temperature, epsilon)
        described = replace(start, calibrated_at=epsilon)
        made.append((described, calibrated(unscaled[key], scale, offset)))
    return made


class _Families:
    """Fits the families of per-sentence classifier on any subset of the training documents
    (all of them for the votes, all but one fold for the out-of-fold logits). A word
    classifier's vocabulary and idf come from the sentences it is fitted on, so a fold's fit
    knows nothing of the fold it scores."""

    def __init__(
        self,
        embeddings: CorpusEmbeddings,
        y: npt.NDArray[np.int64],
        seed: int,
        texts: Sequence[Sequence[str]] | None,
        train: Sequence[int],
    ) -> None:
        self.embeddings, self.y, self.seed, self.texts = embeddings, y, seed, texts
        self.flat = None if texts is None else _aligned_sentences(embeddings, texts)
        self.words: WordFeatures | None = None
        self._vocabularies: dict[tuple[int, ...], WordFeatures] = {}
        if self.flat is not None:
            try:  # none where no word recurs (text without word characters or spaces)
                self.words = self.vocabulary(train)
            except InputError:
                self.words = None

    def vocabulary(self, documents: Sequence[int]) -> WordFeatures:
        """The word features fitted on ``documents``' sentences (those the word classifier
        is fitted on), computed once per set of documents."""
        if self.flat is None:
            raise InternalError("these documents have no texts to fit word features on")
        key = tuple(int(i) for i in documents)  # in order: the sentence sample depends on it
        if key not in self._vocabularies:
            rows, _ = self.sentences(key)
            self._vocabularies[key] = fit_word_features(list(self.flat[rows]))
        return self._vocabularies[key]

    def sentences(
        self, documents: Sequence[int]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The documents' sentence rows, each labelled with its document's class (a seeded
        sample of ``MAX_SENTENCES`` beyond)."""
        offsets = self.embeddings.offsets
        rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in documents])
        labels = np.concatenate(
            [np.full(offsets[i + 1] - offsets[i], self.y[i]) for i in documents]
        )
        if len(rows) > MAX_SENTENCES:
            keep = np.random.default_rng(self.seed).choice(len(rows), MAX_SENTENCES, replace=False)
            keep = np.sort(keep)
            rows, labels = rows[keep], labels[keep]
        return rows, labels

    def embedding_vote(
        self, family: str, strength: float, documents: Sequence[int]
    ) -> SentenceVote:
        """The ``sentences`` or ``documents`` family's classifier at C = ``strength``."""
        from sklearn.linear_model import LogisticRegression

        if family == "sentences":
            rows, targets = self.sentences(documents)
            inputs, iterations = self.embeddings.vectors[rows].astype(np.float64), 500
        else:
            inputs = self.embeddings.means(list(documents))
            targets, iterations = self.y[list(documents)], 5000
        model = LogisticRegression(C=strength, max_iter=iterations, random_state=self.seed)
        model.fit(inputs, targets)
        assert list(model.classes_) == list(range(len(model.classes_)))
        return _as_vote(model.coef_, model.intercept_)

    def word_vote(self, strength: float, documents: Sequence[int]) -> SentenceVote:
        """The word classifier alone (zero embedding weights) at C = ``strength``, fitted on
        the documents' sentences' TF-IDF vectors over their own vocabulary."""
        from sklearn.linear_model import LogisticRegression

        if self.words is None or self.flat is None:
            raise InternalError("no word features were fitted for these documents")
        words = self.vocabulary(documents)
        rows, labels = self.sentences(documents)
        model = LogisticRegression(C=strength, max_iter=1000, random_state=self.seed)
        model.fit(words.matrix(list(self.flat[rows])), labels)
        assert list(model.classes_) == list(range(len(model.classes_)))
        fitted = _as_vote(model.coef_, model.intercept_)
        zero = np.zeros((fitted.classes, self.embeddings.vectors.shape[1]))
        return SentenceVote(zero, fitted.bias, fitted.weights, words)

    def fitter(
        self, family: str, strength: float, word_strength: float | None
    ) -> Callable[[Sequence[int]], SentenceVote]:
        """The fit a :class:`VoteFit` describes (unscaled), as a function of the documents
        it is fitted on."""

        def fit(documents: Sequence[int]) -> SentenceVote:
            if family == "words":
                return self.word_vote(strength, documents)
            embedding = self.embedding_vote(family.removesuffix("+words"), strength, documents)
            if word_strength is None:
                return embedding
            return _combined(embedding, self.word_vote(word_strength, documents))

        return fit


def _combined(embedding: SentenceVote, words: SentenceVote) -> SentenceVote:
    """A product of the two classifiers' probabilities: both intercepts count the class
    prior, which validation weighs like any other difference between fits."""
    return SentenceVote(
        embedding.weights, embedding.bias + words.bias, words.word_weights, words.words
    )


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
            "vote_table": vote.table_by_epsilon.get(key, 0) if better else 0,
        }
        chosen.append(choice.model_copy(update=update))
    return chosen
