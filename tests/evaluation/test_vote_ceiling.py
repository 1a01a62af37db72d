"""The unanimous-vote ceilings: scored by the vote's own distribution."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation.vote_ceiling import ceilings, unanimous_macro_f1
from evaluation.vote_selection import compare
from sentdp.labels import VOTE_UNITS, vote_probabilities
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


@pytest.mark.slow
def test_the_ceilings_of_a_real_bundle_meet_their_non_private_limits(
    quick_bundle_tag: str,
) -> None:
    rows = ceilings(load_from_store(quick_bundle_tag), [1.0, 50.0])
    assert [(split, eps) for split, eps, *_ in rows] == [
        (split, eps) for split in ("validation", "test") for eps in (1.0, 50.0)
    ]
    by_key = {(split, epsilon): scores for split, epsilon, *scores in rows}
    for split, epsilon, true, agreed, nonprivate, led, tally in rows:
        assert agreed <= true + 1e-12
        assert led <= true + 1e-12
        if epsilon == 50.0:  # a lead of 2 sentences or more at epsilon 50: the vote's class
            assert true > 0.999
            assert agreed == pytest.approx(nonprivate, abs=1e-3)
            assert led == pytest.approx(tally, abs=1e-3)
        else:  # less privacy loss, a surer draw
            assert true < by_key[split, 50.0][0]
            assert agreed < by_key[split, 50.0][1]
            assert led < by_key[split, 50.0][3]
    # the tally's label is the served vote's at a large epsilon, unanimous: above it there
    bundle = load_from_store(quick_bundle_tag)
    served = compare(bundle, [50.0])
    for split, _, _, flip, _ in served:
        assert by_key[split, 50.0][3] >= flip - 1e-9
