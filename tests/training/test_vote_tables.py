"""Validation's choice of the hard-vote table's limit (training.vote_tables): its scores are
the vote's own at N = 0, and it picks the table where hard votes are informative and short
documents make the table sharper than the vote's own rule."""

from __future__ import annotations

import numpy as np
import pytest

from sentdp.labels import hard_counts
from tests.service.fakes import DIM, tiny_bundle
from training.label_vote import VoteFit, VoteResult, deviation_scores, with_tables
from training.vote_tables import choose_limit, limit_scores


def _documents(seed: int, lengths: list[int]) -> tuple[list[np.ndarray], list[int]]:
    """Random documents whose true class is their hard votes' plurality (ties: the first)."""
    vote = tiny_bundle(vote=True).votes[0]
    rng = np.random.default_rng(seed)
    documents = [rng.normal(size=(n, DIM)) * 3 for n in lengths]
    truth = [int(np.argmax(hard_counts(vote.logits(d)))) for d in documents]
    return documents, truth


def test_the_limit_0_scores_the_vote_s_own_rule_and_short_plurality_documents_pick_the_table() -> (
    None
):
    vote = tiny_bundle(vote=True).votes[0]
    documents, truth = _documents(0, [2, 3, 2, 3, 4] * 40)
    logits = [vote.logits(d) for d in documents]
    scores = limit_scores(vote, logits, truth, 1.0)
    assert len(scores) == 11
    own = deviation_scores(
        vote, [vote.deviations(d) for d in documents], [len(d) for d in documents], truth, [1.0]
    )
    assert scores[0] == pytest.approx(own["1"], abs=1e-12)
    # documents of 4 sentences and fewer: the limit stops mattering at 4
    assert scores[4:] == [scores[4]] * 7
    assert choose_limit(scores) in (2, 3, 4)
    assert max(scores) > scores[0] + 0.02
    assert choose_limit([0.5, 0.5, 0.4]) == 0  # ties keep the vote's own rule


def test_with_tables_records_the_chosen_limits_and_their_scores() -> None:
    vote = tiny_bundle(vote=True).votes[0]
    documents, truth = _documents(1, [2, 3, 3] * 40)
    own = deviation_scores(
        vote,
        [vote.deviations(d) for d in documents],
        [len(d) for d in documents],
        truth,
        [1.0, 50.0],
    )
    result = VoteResult((VoteFit(vote, 1.0, own),), {"1": 0, "50": 0})
    tabled = with_tables(result, documents, [None] * len(documents), truth, [1.0, 50.0])
    assert tabled.table_by_epsilon.get("1", 0) > 0
    assert tabled.validation_macro_f1["1"] == tabled.table_macro_f1["1"] > own["1"]
    for key in tabled.table_by_epsilon:
        assert tabled.validation_macro_f1[key] > own[key]
    for key in set(own) - set(tabled.table_by_epsilon):
        assert tabled.validation_macro_f1[key] == own[key]
