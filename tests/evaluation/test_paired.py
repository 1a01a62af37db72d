"""The paired comparison with word-level metric DP: each method on that baseline's documents."""

from __future__ import annotations

import numpy as np

from evaluation.experiment import EvalConfig, Experiment
from evaluation.results import Score
from training.classifiers import macro_f1


def experiment(test: list[int], y: list[int], mdp_documents: int) -> Experiment:
    """An Experiment with only what the paired scores read (no corpus, encoder or bundle)."""
    run = Experiment.__new__(Experiment)
    run.test, run.y, run.n_classes = test, np.array(y, dtype=np.int64), 2
    run.config = EvalConfig(mdp_documents=mdp_documents)
    run.on_test, run.eps_sweep = {}, {}
    return run


def test_each_method_is_scored_on_the_subsets_own_rows() -> None:
    # test documents in split order (not sorted); the subset is sorted by document index
    test = [7, 2, 9, 4, 0, 5]
    y = [0, 1, 1, 0, 1, 0, 1, 0, 1, 1]
    run = experiment(test, y, mdp_documents=3)
    subset = run.mdp_documents()
    assert len(subset) == 3
    assert set(subset) <= set(test)
    assert subset == sorted(subset)
    truth = np.array([y[i] for i in test])
    predicted = [truth.copy(), 1 - truth]  # trial 0 always right, trial 1 always wrong
    run.on_test["m"] = {"1": predicted}
    run.eps_sweep["m"] = {"1": Score.of([0.5, 0.5], p=3, variant="paper")}
    paired = run.on_mdp_documents(["m", "absent"])
    assert set(paired) == {"m"}
    score = paired["m"]["1"]
    assert score.trials[1] == 0.0
    assert (score.p, score.variant) == (3, "paper")
    # a prediction right only on the subset's documents scores 1 there, 0 elsewhere
    only_subset = np.array([y[i] if i in subset else 1 - y[i] for i in test])
    run.on_test["m"] = {"1": [only_subset]}
    assert run.on_mdp_documents(["m"])["m"]["1"].trials == (1.0,)
    whole = macro_f1(truth, only_subset, 2)
    assert whole < 1.0
