"""SentenceVote: a private class label straight from the sentences, over r outcomes only.

Each sentence votes through a public per-sentence classifier (linear in the sentence's
embedding and, for a vote that reads words, in its TF-IDF vector, :mod:`sentdp.words`): a
softmax over the r classes, quantized to integers ``q_c(s) = floor(VOTE_UNITS *
softmax_c(s))`` in ``[0, VOTE_UNITS]``. Class c's tally is ``n_c = sum_s q_c(s)``. Replacing
one sentence moves every tally by at most ``VOTE_UNITS`` (a vote depends on its own sentence
only: embedding logits are computed row by row by :func:`sentdp.depth.project`, word logits
sentence by sentence), so the tallies have sensitivity ``VOTE_UNITS`` and a selection
keyed on ``exp(eps' * (n_c - n_max) / (2 * VOTE_UNITS))`` is eps'-SentDP.

Up to :data:`FLIP_MAX_CLASSES` classes the selection is permute-and-flip
(:mod:`sentdp.permute_flip`) rather than the exponential mechanism: the same guarantee, never
a lower expected tally, and at small epsilon nearly twice the exponential mechanism's lead of
the true class over chance. Its exact level masses go through the same floor-safe sampler as
DeepCandidate, at ``eps' = epsilon - eta(r)``, so the guarantee is exactly the epsilon
charged. Above that many classes it is the exponential mechanism
``P(c) proportional to exp(eps' * n_c / (2 * VOTE_UNITS))``.

A vote made ``by_count`` (bundle format version 5) uses the document's sentence count n,
which neighbours share: its exponential mechanism is calibrated to n
(:mod:`sentdp.count_calibrated`, up to twice as sharp for one sentence), and below the flip
limit it is drawn that way for the n where a public rule prefers it to permute-and-flip
(short documents at small epsilon), by permute-and-flip otherwise.

A document of at most N sentences (N chosen on validation per epsilon, the p table's
``vote_table``) is drawn instead from :mod:`sentdp.vote_table`: each sentence's whole vote
goes to its likeliest class, and an epsilon-SentDP table over such hard votes (a linear
program's, made without data) releases a class. Which rule draws a document depends on its
sentence count only, which neighbours share, so each document is drawn by one
epsilon-SentDP rule.

Neither permute-and-flip, the calibrated mechanism nor the table has epsilon-bounded range (the
spread of an outcome's log ratio between neighbours can reach about 2 epsilon), which the
zCDP charge ``epsilon**2 / 8`` needs. A ``bounded_range`` draw (the service asks for it for
tenants that account in zCDP) is the standard exponential mechanism at the vote's
``epsilon - eta(r)``: its log ratios span at most ``eps' + eta_EM(r) <= epsilon``
(:func:`~sentdp.mechanism.privacy_slack` counts the range).

A vote's *shape* is where its per-sentence votes lie. A ``simplex`` vote is the softmax
above (a sentence's units sum to at most U). A ``cube`` vote (bundle format version 7) is
``floor(VOTE_UNITS * exp(l_c - l_max))``: the sentence's likeliest class gets all U units and
every other class U times its probability relative to the likeliest. It lies in the cube
``[0, U]^r``, so one replaced sentence still moves each tally by at most U, and the
selections above, which need only that per-class bound, keep their guarantee. It multiplies
each sentence's tally differences by 1 / (its top probability): uncertain sentences count for
more (measured on clothing reviews' validation at epsilon 3, expected macro-F1 0.383 ->
0.421). The sentence-count rule is proven for simplex votes only, so a cube vote is never
drawn by count.

Why: DeepCandidate chooses among m candidates, so at small epsilon its choice is spread over
many of them (the exponential mechanism's utility gap grows with ln m); a label needs only r
outcomes, and a sentence's vote is bounded in [0, 1] per class however unusual it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import numpy.typing as npt

from sentdp.count_calibrated import count_rate, uses_count_rate
from sentdp.depth import project
from sentdp.errors import InputError, InternalError
from sentdp.mechanism import DeepCandidate, epsilon_less_slack, floored_log_probs, privacy_slack
from sentdp.permute_flip import flip_probabilities, flip_slack
from sentdp.sampling import (
    GAMMA,
    LevelWeights,
    RandomBytes,
    SelectionPlan,
    exact_product,
    plan_levels,
    plan_selection,
)
from sentdp.vote_table import LONGEST, hard_vote_table, makes_table
from sentdp.words import WordFeatures

VOTE_UNITS = 64
"""A sentence's vote for one class is an integer in [0, VOTE_UNITS] (its probability, floored)."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

VoteShape = Literal["simplex", "cube"]
VOTE_SHAPES: tuple[VoteShape, ...] = ("simplex", "cube")
"""Where a sentence's vote lies: the simplex (softmax, units summing to at most U) or the
cube [0, U]^r (U for its likeliest class); see the module docstring."""


def tally_deviations(votes: IntArray) -> IntArray:
    """(r,) ``max_c n_c - n_c`` of (k, r) per-sentence votes, ``n_c`` their column sums."""
    tallies = votes.sum(axis=0)
    deviations: IntArray = tallies.max() - tallies
    return deviations


def hard_counts(logits: FloatArray) -> list[int]:
    """(r,) how many of the sentences give their whole vote to each class: each sentence's
    likeliest class (the first on ties), a function of that sentence's logits alone."""
    values = np.asarray(logits)
    if not np.isfinite(values).all():  # as votes_from_logits: damaged weights fail closed
        raise InternalError("a vote's logits are not finite; the vote's weights are damaged")
    counts: list[int] = np.bincount(np.argmax(values, axis=1), minlength=values.shape[1]).tolist()
    return counts


def table_limit(sentences: int) -> int:
    """Validate a short-document limit N (documents of at most N sentences are drawn from
    :mod:`sentdp.vote_table`; 0: none)."""
    if isinstance(sentences, bool) or not isinstance(sentences, int | np.integer):
        raise InputError(f"a table limit is an integer, got {sentences!r}")
    if not 0 <= sentences <= LONGEST:
        raise InputError(f"a table limit is 0 to {LONGEST} sentences, got {sentences}")
    return int(sentences)


@dataclass(frozen=True)
class SentenceVote:
    """The label mechanism: a public linear per-sentence classifier ``softmax(x W^T + b)``
    over sentence embeddings x (the encoder's G, before any recoding), optionally plus a
    linear classifier on the sentence's words (``t(s) U^T``, t the sentence's TF-IDF vector
    over a public vocabulary, :mod:`sentdp.words`)."""

    weights: FloatArray
    """(r, d) float64."""
    bias: FloatArray
    """(r,) float64."""
    word_weights: FloatArray | None = None
    """(r, V) float64, U above; with ``words``, or neither."""
    words: WordFeatures | None = None
    """The public vocabulary ``word_weights`` is over."""
    by_count: bool = False
    """Whether the selection may use the document's sentence count (:func:`vote_plan`)."""
    shape: VoteShape = "simplex"
    """Where a sentence's vote lies (:data:`VOTE_SHAPES`); a cube vote is never ``by_count``."""

    def __post_init__(self) -> None:
        if self.shape not in VOTE_SHAPES:
            raise InputError(f"a vote's shape is one of {VOTE_SHAPES}, got {self.shape!r}")
        if self.shape == "cube" and self.by_count:
            raise InputError("the sentence-count rule is proven for simplex votes only")
        w, b = np.asarray(self.weights), np.asarray(self.bias)
        if w.ndim != 2 or b.shape != (w.shape[0],) or w.shape[0] < 2:
            raise InputError(f"a vote needs (r, d) weights and (r,) bias, r >= 2; got {w.shape}")
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise InputError("the vote classifier's weights must be finite")
        if (self.word_weights is None) != (self.words is None):
            raise InputError("a vote's word weights and its vocabulary come together")
        if self.word_weights is not None and self.words is not None:
            u = np.asarray(self.word_weights)
            if u.shape != (w.shape[0], self.words.size):
                raise InputError(
                    f"word weights must be ({w.shape[0]}, {self.words.size}), got {u.shape}"
                )
            if not np.isfinite(u).all():
                raise InputError("the vote's word weights must be finite")

    @property
    def classes(self) -> int:
        return int(self.weights.shape[0])

    @property
    def reads_words(self) -> bool:
        """Whether the votes read the sentences' texts as well as their embeddings."""
        return self.words is not None

    def same_as(self, other: SentenceVote) -> bool:
        """Whether both votes draw the same labels for every document (equal parameters and
        selection rule)."""
        if (self.by_count, self.shape) != (other.by_count, other.shape) or not (
            np.array_equal(self.weights, other.weights) and np.array_equal(self.bias, other.bias)
        ):
            return False
        if self.words is None or other.words is None:
            return self.words is None and other.words is None
        return self.words.same_as(other.words) and np.array_equal(
            np.asarray(self.word_weights), np.asarray(other.word_weights)
        )

    def scaled(self, temperature: float) -> SentenceVote:
        """The same classifier with every logit divided by ``temperature``."""
        words = None if self.word_weights is None else self.word_weights / temperature
        return SentenceVote(
            self.weights / temperature,
            self.bias / temperature,
            words,
            self.words,
            self.by_count,
            self.shape,
        )

    def counted(self, by_count: bool = True) -> SentenceVote:
        """The same classifier with the selection rule ``by_count``."""
        return SentenceVote(
            self.weights, self.bias, self.word_weights, self.words, by_count, self.shape
        )

    def shaped(self, shape: VoteShape) -> SentenceVote:
        """The same classifier voting in ``shape``; a cube vote is drawn without the count."""
        by_count = self.by_count and shape == "simplex"
        return SentenceVote(self.weights, self.bias, self.word_weights, self.words, by_count, shape)

    def logits(self, sentences: npt.ArrayLike, texts: Sequence[str] | None = None) -> FloatArray:
        """(k, r) per-sentence logits, each row a function of its sentence alone."""
        x = np.asarray(sentences, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] != self.weights.shape[1]:
            raise InputError(
                f"sentences must be a non-empty (k, {self.weights.shape[1]}) array, "
                f"got shape {x.shape}"
            )
        if not np.isfinite(x).all():
            raise InputError("sentence embeddings must be finite (no NaN or infinity)")
        logits: FloatArray = project(x, self.weights) + self.bias
        if self.words is not None and self.word_weights is not None:
            if texts is None:
                raise InputError("this vote reads its sentences' words: pass their texts")
            if len(texts) != x.shape[0]:
                raise InputError(f"got {x.shape[0]} sentence embeddings but {len(texts)} texts")
            logits += self.words.logits(texts, self.word_weights)
        return logits

    def votes(self, sentences: npt.ArrayLike, texts: Sequence[str] | None = None) -> IntArray:
        """(k, r) integer votes in [0, VOTE_UNITS], each row a function of its sentence alone
        (its embedding and, for a vote that reads words, its text): in the simplex or the
        cube, by :attr:`shape`."""
        return self.votes_from_logits(self.logits(sentences, texts))

    def votes_from_logits(self, logits: FloatArray) -> IntArray:
        """:meth:`votes` from this vote's own :meth:`logits` (callers that reuse them across
        shapes: the logits do not depend on the shape or the rule)."""
        logits = np.array(logits, dtype=np.float64)
        if not np.isfinite(logits).all():  # only out-of-range weights get here: fail closed
            raise InternalError("a vote's logits are not finite; the vote's weights are damaged")
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        if self.shape == "simplex":
            probs /= probs.sum(axis=1, keepdims=True)
        votes: IntArray = np.clip(np.floor(probs * VOTE_UNITS), 0, VOTE_UNITS).astype(np.int64)
        return votes

    def deviations(self, sentences: npt.ArrayLike, texts: Sequence[str] | None = None) -> IntArray:
        """(r,) ``max_c n_c - n_c``: how far each class's tally is behind the leader's."""
        return tally_deviations(self.votes(sentences, texts))

    def log_probs(
        self,
        sentences: npt.ArrayLike,
        epsilon: float,
        texts: Sequence[str] | None = None,
        *,
        bounded_range: bool = False,
        table_sentences: int = 0,
    ) -> FloatArray:
        """(r,) natural-log probabilities with which :meth:`sample_batch` picks each class."""
        logits = self.logits(sentences, texts)
        count = logits.shape[0]
        if self._tabled(count, epsilon, bounded_range, table_sentences):
            table = hard_vote_table(count, self.classes, epsilon)
            return np.log(table.probabilities(hard_counts(logits)))
        deviations = tally_deviations(self.votes_from_logits(logits))
        return self.log_probs_for(deviations, epsilon, count, bounded_range=bounded_range)

    def _tabled(self, count: int, epsilon: float, bounded_range: bool, limit: int) -> bool:
        """Whether a ``count``-sentence document is drawn from the hard-vote table: at most
        ``limit`` sentences, not a bounded-range draw, and a table exists for (n, r,
        epsilon). A rule of public numbers only (neighbours share n)."""
        if bounded_range or count > table_limit(limit):
            return False
        return makes_table(count, self.classes, epsilon)

    def plan_from_logits(
        self,
        logits: FloatArray,
        epsilon: float,
        *,
        bounded_range: bool = False,
        table_sentences: int = 0,
    ) -> SelectionPlan:
        """The plan for a document from its :meth:`logits`: a document of at most
        ``table_sentences`` sentences is drawn from the hard-vote table
        (:mod:`sentdp.vote_table`), unless ``bounded_range`` (the table's range is not
        bounded); any other by the vote's rule."""
        count = len(logits)
        if self._tabled(count, epsilon, bounded_range, table_sentences):
            return hard_vote_table(count, self.classes, epsilon).plan(hard_counts(logits))
        deviations = tally_deviations(self.votes_from_logits(logits))
        return self.plan_for(deviations, epsilon, count, bounded_range=bounded_range)

    def plan_for(
        self, deviations: IntArray, epsilon: float, sentences: int, *, bounded_range: bool = False
    ) -> SelectionPlan:
        """The plan for a document of ``sentences`` sentences whose :meth:`deviations` are
        known (callers that reuse them across epsilons); ``bounded_range``: the standard
        exponential mechanism, whatever the vote's rule."""
        if bounded_range:
            return bounded_vote_plan(deviations, epsilon)
        return vote_plan(deviations, epsilon, sentences if self.by_count else None)

    def log_probs_for(
        self,
        deviations: npt.ArrayLike,
        epsilon: float,
        sentences: int,
        *,
        bounded_range: bool = False,
    ) -> FloatArray:
        """:meth:`log_probs` from known deviations of a ``sentences``-sentence document."""
        if bounded_range:
            return exponential_vote_log_probs(deviations, epsilon)
        return vote_log_probs(deviations, epsilon, sentences if self.by_count else None)

    def plan_batch(
        self,
        documents: Sequence[npt.ArrayLike],
        epsilons: Sequence[float],
        *,
        texts: Sequence[Sequence[str]] | None = None,
        bounded_range: bool = False,
        table_sentences: int = 0,
    ) -> list[SelectionPlan]:
        """Every document's selection plan; validates everything and draws no randomness.
        ``texts``: each document's sentences, needed by a vote that reads words;
        ``bounded_range``: draw by the epsilon-bounded-range exponential mechanism;
        ``table_sentences``: documents of at most this many sentences are drawn from the
        hard-vote table (:meth:`plan_from_logits`)."""
        if len(epsilons) != len(documents):
            raise InputError(f"got {len(documents)} documents but {len(epsilons)} epsilons")
        if texts is not None and len(texts) != len(documents):
            raise InputError(f"got {len(documents)} documents but {len(texts)} texts")
        per_document = texts if texts is not None else [None] * len(documents)
        limit = table_limit(table_sentences)
        return [
            self.plan_from_logits(
                self.logits(doc, text), eps, bounded_range=bounded_range, table_sentences=limit
            )
            for doc, eps, text in zip(documents, epsilons, per_document, strict=True)
        ]

    def sample_batch(
        self,
        documents: Sequence[npt.ArrayLike],
        epsilons: Sequence[float],
        rng: RandomBytes | None = None,
        *,
        texts: Sequence[Sequence[str]] | None = None,
        table_sentences: int = 0,
    ) -> IntArray:
        """One private class index per document (epsilon-SentDP each)."""
        plans = self.plan_batch(documents, epsilons, texts=texts, table_sentences=table_sentences)
        return DeepCandidate.draw_plans(plans, rng)


FLIP_MAX_CLASSES = 32
"""Up to this many classes the vote is drawn by permute-and-flip; above, by the exponential
mechanism (the same guarantee, a lower expected tally). Permute-and-flip's exact masses cost
O(r**3) bit operations per document: ~0.3 ms at 13 classes, ~50 ms at 100 (measured)."""


def vote_selection(classes: int) -> str:
    """How a vote over ``classes`` classes is drawn: "permute-and-flip" or "exponential"."""
    return "permute-and-flip" if classes <= FLIP_MAX_CLASSES else "exponential"


def vote_slack(classes: int) -> float:
    """eta(r): the epsilon the vote's float error costs; a vote needs ``epsilon > eta(r)``."""
    flip = vote_selection(classes) == "permute-and-flip"
    return flip_slack(classes) if flip else privacy_slack(classes)


def vote_epsilon(epsilon: float, classes: int) -> float:
    """``epsilon - eta(r)``: what the vote's selection runs at so that the guarantee is
    ``epsilon``."""
    slack = vote_slack(classes)
    return epsilon_less_slack(epsilon, slack, f"the vote's float slack for {classes} classes")


def _flip_weights(epsilon: float) -> LevelWeights:
    """Level weights of permute-and-flip at ``epsilon' = epsilon - eta(r)``: a class whose
    tally is ``dev`` behind the leader's is kept with probability
    ``exp(-eps' * dev / (2 U))`` when visited (U = :data:`VOTE_UNITS`, the sensitivity)."""

    def weights(counts: list[int], deviations: list[int]) -> list[int]:
        rate = vote_epsilon(epsilon, sum(counts)) / (2.0 * VOTE_UNITS)
        gaps = [exact_product(rate, dev - deviations[0]) for dev in deviations]
        return flip_probabilities(counts, gaps)[0]

    return weights


def _exponential_rate(epsilon: float, classes: int) -> float:
    """The rate :func:`~sentdp.sampling.plan_selection` weighs a level by
    (``exp(-rate * dev / 4)``) so that a class is weighed by ``exp(eps' * n_c / (2 U))``."""
    return 2.0 * vote_epsilon(epsilon, classes) / VOTE_UNITS


def _count_calibrated(epsilon: float, classes: int, sentences: int | None) -> float | None:
    """z of the count-calibrated exponential mechanism when a vote over ``classes`` classes
    of a ``sentences``-sentence document is drawn by it at ``epsilon`` (None: it is not).
    It runs at the vote's ``epsilon - eta(r)``: its own float slack is the exponential
    mechanism's, at most permute-and-flip's."""
    if sentences is None:
        return None
    if isinstance(sentences, bool) or not isinstance(sentences, int | np.integer) or sentences < 1:
        raise InternalError(f"a document has at least one sentence, got {sentences!r}")
    run_at = vote_epsilon(epsilon, classes)
    flip = vote_selection(classes) == "permute-and-flip"
    if flip and not uses_count_rate(run_at, int(sentences), classes):
        return None
    return count_rate(run_at, int(sentences), classes)


def vote_plan(deviations: IntArray, epsilon: float, sentences: int | None = None) -> SelectionPlan:
    """The sampler's plan for a vote's ``deviations`` (one per class) at ``epsilon``: what
    :meth:`SentenceVote.plan_batch` does, for callers that reuse deviations across epsilons.
    With ``sentences`` (a vote made ``by_count``), the count-calibrated rule."""
    r = len(deviations)
    z = _count_calibrated(epsilon, r, sentences)
    if z is not None:  # P(c) ~ exp(z n_c / U): plan_selection weighs exp(-rate dev / 4)
        return plan_selection(deviations, 4.0 * z / VOTE_UNITS)
    if vote_selection(r) == "exponential":
        return bounded_vote_plan(deviations, epsilon)
    vote_epsilon(epsilon, r)  # validates before any arithmetic
    return plan_levels(deviations, _flip_weights(epsilon))


def bounded_vote_plan(deviations: IntArray, epsilon: float) -> SelectionPlan:
    """The plan of the standard exponential mechanism over the tallies at the vote's
    ``epsilon - eta(r)``: epsilon-bounded range (eta(r) is at least the exponential
    mechanism's own :func:`~sentdp.mechanism.privacy_slack`, which covers the range)."""
    return plan_selection(deviations, _exponential_rate(epsilon, len(deviations)))


def vote_log_probs(
    deviations: npt.ArrayLike, epsilon: float, sentences: int | None = None
) -> FloatArray:
    """The exact distribution of the vote, mixed with the floor: for permute-and-flip the
    float log of each class's exact rational mass (from the integers the sampler's thresholds
    are cut from). With ``sentences``, the count-calibrated rule."""
    dev = np.asarray(deviations, dtype=np.int64)
    r = dev.shape[0]
    gamma = Fraction(GAMMA)
    z = _count_calibrated(epsilon, r, sentences)
    if z is not None:
        return floored_log_probs(np.asarray(-z * dev / VOTE_UNITS, dtype=np.float64))
    if vote_selection(r) == "exponential":
        return exponential_vote_log_probs(dev, epsilon)
    vote_epsilon(epsilon, r)
    levels, inverse, counts = np.unique(dev, return_inverse=True, return_counts=True)
    weights = _flip_weights(epsilon)([int(c) for c in counts], [int(v) for v in levels])
    total = sum(weights)
    per_level = [
        math.log((1 - gamma) * Fraction(w, int(n) * total) + gamma / r)
        for w, n in zip(weights, counts, strict=True)
    ]
    mixed: FloatArray = np.array(per_level)[inverse]
    return mixed


def exponential_vote_log_probs(deviations: npt.ArrayLike, epsilon: float) -> FloatArray:
    """The exponential mechanism over the tallies at the vote's ``epsilon - eta(r)``, mixed
    with the floor: the vote's distribution above :data:`FLIP_MAX_CLASSES` classes, and the
    rule permute-and-flip is compared with below."""
    dev = np.asarray(deviations, dtype=np.int64)
    rate = _exponential_rate(epsilon, dev.shape[0])
    return floored_log_probs(np.asarray(-rate * dev / 4.0, dtype=np.float64))


def vote_probabilities(
    deviations: npt.ArrayLike, epsilon: float, sentences: Sequence[int] | None = None
) -> FloatArray:
    """(N, r) probabilities of the vote for N documents' (N, r) deviations at ``epsilon``,
    in floats: ``exp(vote_log_probs(...))`` of each row to within about 1e-12, for scoring
    many documents at once (training's validation). With ``sentences`` (each document's
    count, for a vote made ``by_count``), the count-calibrated rule where it applies. The
    sampler never uses these: its thresholds come from the exact plan (:func:`vote_plan`).

    Permute-and-flip's ``P(c) = a_c * integral_0^1 prod_{j != c} (1 - a_j x) dx`` is a
    polynomial of degree r - 1, integrated exactly by Gauss-Legendre with r // 2 + 1 nodes;
    every factor is positive at the nodes, so the sum has no cancellation.
    """
    dev = np.asarray(deviations, dtype=np.float64)
    if dev.ndim != 2 or dev.shape[1] < 2 or (dev < 0).any():
        raise InputError(f"deviations must be an (N, r >= 2) array >= 0, got shape {dev.shape}")
    n, r = dev.shape
    if sentences is not None and len(sentences) != n:
        raise InputError(f"got {n} documents' deviations but {len(sentences)} sentence counts")
    probs = np.empty((n, r))
    calibrated = np.zeros(n, dtype=bool)
    for i, count in enumerate(sentences if sentences is not None else ()):
        z = _count_calibrated(epsilon, r, int(count))
        if z is not None:
            probs[i] = np.exp(floored_log_probs(-z * dev[i] / VOTE_UNITS))
            calibrated[i] = True
    rest = dev[~calibrated]
    run_at = vote_epsilon(epsilon, r)
    if vote_selection(r) == "exponential":
        scores = -run_at * rest / (2.0 * VOTE_UNITS)
        mechanism = np.exp(scores - scores.max(axis=1, keepdims=True))
        mechanism /= mechanism.sum(axis=1, keepdims=True)
    else:
        nodes, weights = np.polynomial.legendre.leggauss(r // 2 + 1)
        x, w = (nodes + 1.0) / 2.0, weights / 2.0
        behind = rest - rest.min(axis=1, keepdims=True)  # the leader's a is 1, as exactly
        a = np.exp(-run_at * behind / (2.0 * VOTE_UNITS))
        factors = 1.0 - a[:, :, None] * x[None, None, :]
        others = factors.prod(axis=1, keepdims=True) / factors
        mechanism = a * (others @ w)
    probs[~calibrated] = (1.0 - GAMMA) * mechanism + GAMMA / r
    return probs
