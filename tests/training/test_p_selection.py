"""The p table's choice between Tukey depth and the clipped-mean rule (training.p_selection)."""

from __future__ import annotations

import numpy as np

from sentdp.mean_selection import RADII, MeanCandidate
from sentdp.mechanism import DeepCandidate
from training.p_selection import (
    MEAN,
    Option,
    candidate_confusion,
    choose_p,
    radii_of,
    soft_macro_f1,
)

DIM = 6


def two_classes(seed: int, documents: int = 40) -> tuple[np.ndarray, np.ndarray, list, list]:
    """Candidates around two centres, and validation documents of three sentences near the
    centre of their class (so the distance to the mean separates the classes well)."""
    rng = np.random.default_rng(seed)
    centres = np.zeros((2, DIM))
    centres[0, 0], centres[1, 0] = 1.0, -1.0
    labels = np.repeat([0, 1], 20).astype(np.int64)
    candidates = centres[labels] + rng.normal(scale=0.3, size=(40, DIM))
    truth = [n % 2 for n in range(documents)]
    docs = [centres[t] + rng.normal(scale=0.6, size=(3, DIM)) for t in truth]
    return candidates, labels, docs, truth


def option(seed: int, radii: dict[str, float], labels: np.ndarray | None = None) -> Option:
    candidates, own_labels, docs, _ = two_classes(seed)
    directions = np.random.default_rng(seed + 1).normal(size=(4, DIM))
    return Option(
        variant="v",
        mechanism=DeepCandidate(candidates, directions),
        documents=docs,
        candidate_labels=own_labels if labels is None else labels,
        ps=(2, 4),
        means={name: MeanCandidate(candidates, r) for name, r in radii.items()},
    )


def test_the_mean_rule_is_scored_exactly_and_chosen_where_it_scores_best() -> None:
    chosen = option(0, {"q0.5": 1.0, "q0.9": 2.0})
    _, _, docs, truth = two_classes(0)
    epsilons = (0.5, 3.0, 30.0)
    table, scores = choose_p([chosen], truth, 2, epsilons)
    assert set(scores["v"]) == {"2", "4", MEAN + "q0.5", MEAN + "q0.9"}
    mean = chosen.means["q0.9"]
    by_hand = [
        soft_macro_f1(
            candidate_confusion(
                (np.exp(mean.log_probs(d, e)) for d in docs), truth, chosen.candidate_labels, 2
            )
        )
        for e in epsilons
    ]
    assert scores["v"][MEAN + "q0.9"] == by_hand
    for column, choice in enumerate(table):
        best = max(values[column] for values in scores["v"].values())
        assert choice.validation_macro_f1 == best
        if choice.selection == "mean":
            assert choice.p == 1
            assert choice.radius in (1.0, 2.0)
            name = "q0.5" if choice.radius == 1.0 else "q0.9"
            assert scores["v"][MEAN + name][column] == best
        else:
            assert choice.radius is None
            assert scores["v"][str(choice.p)][column] == best
    # at epsilon 0.5 three sentences give Tukey depth almost nothing to go on: the mean wins
    assert table[0].selection == "mean"
    assert max(scores["v"][MEAN + n][0] for n in ("q0.5", "q0.9")) > max(
        scores["v"]["2"][0], scores["v"]["4"][0]
    )


def test_ties_go_to_tukey_depth_and_no_radii_mean_depth_only() -> None:
    """Candidates all of one class: every rule scores the same, and the paper's rule stays."""
    _, _, _, truth = two_classes(1)
    tied = option(1, {"q0.5": 1.0}, labels=np.zeros(40, dtype=np.int64))
    table, scores = choose_p([tied], truth, 2, (1.0, 10.0))
    assert len({tuple(v) for v in scores["v"].values()}) == 1
    assert [(c.selection, c.p) for c in table] == [("depth", 2), ("depth", 2)]
    table, scores = choose_p([option(1, {})], truth, 2, (1.0,))
    assert set(scores["v"]) == {"2", "4"}
    assert table[0].selection == "depth"


def test_radii_are_named_quantiles_of_public_norms_inside_the_rule_s_range() -> None:
    rows = np.zeros((5, DIM))
    rows[:, 0] = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert radii_of(rows, (0.25, 0.5, 1.0)) == {"q0.25": 2.0, "q0.5": 3.0, "q1": 5.0}
    assert radii_of(np.zeros((3, DIM)), (0.5,)) == {"q0.5": RADII[0]}
