"""Which short documents each grid epsilon's vote draws from the hard-vote table.

:mod:`sentdp.vote_table` gives, for documents of n <= 10 sentences, the best epsilon-SentDP
rule over hard votes (each sentence's whole vote to its likeliest class). It is sharper than
the vote's own rule where the group-privacy budget n * epsilon is small, and throws away the
graded votes that count for more where it is large, so per grid epsilon validation chooses
the limit N (documents of at most N sentences get the table, 0: none) of best expected
macro-F1. Measured on clothing reviews (13 classes, median 5 sentences), test macro-F1
without and with the validation-chosen N: epsilon 1, 0.192 -> 0.228 (N = 9); epsilon 3,
0.430 -> 0.437 (N = 3); epsilon 6, N = 0. Corpora of longer documents choose N = 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sentdp.labels import SentenceVote, hard_counts, tally_deviations, vote_probabilities
from sentdp.vote_table import LONGEST, hard_vote_table, makes_table
from training.p_selection import soft_macro_f1

FloatArray = npt.NDArray[np.float64]


def limit_scores(
    vote: SentenceVote, logits: Sequence[FloatArray], truth: Sequence[int], epsilon: float
) -> list[float]:
    """Expected macro-F1 of the private vote at ``epsilon`` with each limit N = 0 ..
    :data:`~sentdp.vote_table.LONGEST` (``scores[N]``), from the documents' :meth:`logits`
    (exact probabilities, as the service draws them: by the vote's own rule where no table
    is made for the epsilon)."""
    return scores_by_limit(
        truth,
        [len(x) for x in logits],
        served_probabilities(vote, logits, epsilon),
        hard_table_probabilities(vote, logits, epsilon),
        vote.classes,
    )


def served_probabilities(
    vote: SentenceVote, logits: Sequence[FloatArray], epsilon: float
) -> FloatArray:
    """(documents, r) each document's probabilities under the vote's own rule."""
    counts = [len(x) for x in logits]
    deviations = np.stack([tally_deviations(vote.votes_from_logits(x)) for x in logits])
    own: FloatArray = vote_probabilities(deviations, epsilon, counts if vote.by_count else None)
    return own


def hard_table_probabilities(
    vote: SentenceVote, logits: Sequence[FloatArray], epsilon: float, longest: int = LONGEST
) -> list[FloatArray | None]:
    """Each document's probabilities under the hard-vote table for its sentence count, None
    where it has more than ``longest`` sentences or no table is made."""
    return [
        hard_vote_table(len(x), vote.classes, epsilon).probabilities(hard_counts(x))
        if len(x) <= longest and makes_table(len(x), vote.classes, epsilon)
        else None
        for x in logits
    ]


def scores_by_limit(
    truth: Sequence[int],
    counts: Sequence[int],
    own: FloatArray,
    tabled: Sequence[FloatArray | None],
    classes: int,
    longest: int = LONGEST,
) -> list[float]:
    """Expected macro-F1 with each limit N = 0 .. ``longest``: a document of at most N
    sentences drawn by its ``tabled`` probabilities (where it has them), any other by its
    row of ``own`` (documents, r)."""
    scores = []
    for limit in range(longest + 1):
        confusion = np.zeros((classes, classes))
        for y, n, served, table in zip(truth, counts, own, tabled, strict=True):
            confusion[y] += table if table is not None and n <= limit else served
        scores.append(soft_macro_f1(confusion))
    return scores


def choose_limit(scores: Sequence[float]) -> int:
    """The limit of best score, the smallest of equals (0, the vote's own rule, on ties)."""
    return int(np.argmax(np.asarray(scores)))
