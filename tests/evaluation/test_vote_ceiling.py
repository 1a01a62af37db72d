"""The unanimous-vote ceilings: scored by the vote's own distribution."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.vote_ceiling import ceilings, unanimous_macro_f1
from evaluation.vote_selection import compare
from sentdp.labels import VOTE_UNITS, vote_probabilities
from sentdp.vote_table import LONGEST, hard_vote_table
from training.p_selection import soft_macro_f1
from training.store import load_from_store


def test_a_unanimous_vote_is_scored_by_permute_and_flip_with_the_documents_lead() -> None:
    voted, counts, truth = [0, 2, 1], [2, 5, 3], [0, 2, 2]
    for epsilon in (1.0, 3.0):
        confusion = np.zeros((3, 3))
        for v, n, t in zip(voted, counts, truth, strict=True):
            deviations = np.full(3, n * VOTE_UNITS)
            deviations[v] = 0
            confusion[t] += vote_probabilities(deviations[None, :], epsilon)[0]
        expected = soft_macro_f1(confusion)
        assert unanimous_macro_f1(voted, counts, truth, 3, epsilon) == pytest.approx(expected)
    # longer documents lead by more; a large epsilon follows the vote
    assert unanimous_macro_f1([0, 1], [4, 4], [0, 1], 2, 1.0) > unanimous_macro_f1(
        [0, 1], [2, 2], [0, 1], 2, 1.0
    )
    assert unanimous_macro_f1([0, 1], [2, 2], [0, 1], 2, 50.0) > 0.999
    assert unanimous_macro_f1([1, 0], [2, 2], [0, 1], 2, 50.0) < 0.001


def test_with_a_limit_short_documents_are_scored_by_the_hard_vote_table() -> None:
    voted, counts, truth = [0, 2, 1, 1], [2, 5, 3, 12], [0, 2, 2, 1]
    classes, epsilon = 4, 1.0
    confusion = np.zeros((classes, classes))
    for v, n, t in zip(voted, counts, truth, strict=True):
        if n <= 4:  # the limit below: the table of the document's unanimous hard votes
            hard = [0] * classes
            hard[v] = n
            confusion[t] += hard_vote_table(n, classes, epsilon).probabilities(hard)
        else:  # 5 and 12 sentences: permute-and-flip, as without a limit
            deviations = np.full(classes, n * VOTE_UNITS)
            deviations[v] = 0
            confusion[t] += vote_probabilities(deviations[None, :], epsilon)[0]
    expected = soft_macro_f1(confusion)
    assert unanimous_macro_f1(voted, counts, truth, classes, epsilon, 4) == pytest.approx(expected)
    # over 13 classes a unanimous 3-sentence document is released far more surely by the
    # table (near group privacy's e^3 / (e^3 + 12)) than by permute-and-flip
    short = ([0, 1, 2, 3], [3, 3, 3, 3], [0, 1, 2, 3])
    assert unanimous_macro_f1(*short, 13, epsilon, LONGEST) > 1.4 * unanimous_macro_f1(
        *short, 13, epsilon
    )


@pytest.mark.slow
def test_the_ceilings_of_a_real_bundle_meet_their_non_private_limits(
    quick_bundle_tag: str,
) -> None:
    rows = ceilings(load_from_store(quick_bundle_tag), [1.0, 50.0])
    assert [(split, eps) for split, eps, *_ in rows] == [
        (split, eps) for split in ("validation", "test") for eps in (1.0, 50.0)
    ]
    by_key = {(c.split, c.epsilon): c for c in rows}
    for c in rows:
        for flip, table in ((c.true, c.true_table), (c.agreed, c.agreed_table)):
            assert table >= flip - 1e-9  # unanimous votes: the table is the surer rule
        assert c.agreed <= c.true + 1e-12
        assert c.led <= c.true + 1e-12
        assert c.agreed_table <= c.true_table + 1e-12
        assert c.led_table <= c.true_table + 1e-12
        if c.epsilon == 50.0:  # a lead of 2 sentences or more at epsilon 50: the vote's class
            assert c.true > 0.999
            assert c.true_table > 0.999
            assert c.agreed == pytest.approx(c.nonprivate, abs=1e-3)
            assert c.led == pytest.approx(c.tally, abs=1e-3)
        else:  # less privacy loss, a surer draw
            above = by_key[c.split, 50.0]
            assert c.true < above.true
            assert c.agreed < above.agreed
            assert c.led < above.led
    # the tally's label is the served vote's at a large epsilon, unanimous: above it there
    bundle = load_from_store(quick_bundle_tag)
    served = compare(bundle, [50.0])
    for split, _, _, flip, _ in served:
        assert by_key[split, 50.0].led >= flip - 1e-9
