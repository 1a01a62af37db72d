"""sentdp-eval in quick mode on a small real slice: the report's structure and sanity."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from evaluation.experiment import EvalConfig, rescore_labels, run_evaluation
from evaluation.report import read_results, write_report
from evaluation.results import Score
from training.settings import load_settings
from training.store import load_from_store

pytestmark = pytest.mark.slow


def test_quick_evaluation_writes_tables_plots_and_json(
    quick_bundle_tag: str, tmp_path: Path
) -> None:
    bundle = load_from_store(quick_bundle_tag)
    config = EvalConfig(
        trials=2, epsilons=(1.0, 10.0), k_epsilon=10.0, mdp_documents=8, max_test_documents=20
    )
    results = run_evaluation([bundle], load_settings(), config, log=lambda _: None)
    command = "sentdp-eval --model x --quick"
    paths = write_report(dataclasses.replace(results, command=command), tmp_path)
    assert {p.name for p in paths} == {"results.json", "report.md", "eps_sweep.png", "k_sweep.png"}
    for png in ("eps_sweep.png", "k_sweep.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["test_documents"] == 20
    assert stored["split_seed"] == bundle.manifest.corpus.split_seed  # pairs seeds' reports
    key = f"deepcandidate:{bundle.manifest.name}"
    vote = f"sentence_vote:{bundle.manifest.name}"
    served = f"classify:{bundle.manifest.name}"
    private = [key, vote, served, "truncation", "word_mdp"]
    assert stored["methods"] == [*private, "nonprivate", "random_guess"]
    for epsilon in ("1", "10"):  # /classify serves the source the bundle's table names
        by_vote = bundle.manifest.choice_for(float(epsilon)).label == "vote"
        source = stored["eps_sweep"][vote if by_vote else key][epsilon]
        assert stored["eps_sweep"][served][epsilon]["trials"] == source["trials"]
    for method in stored["methods"]:
        for epsilon in ("1", "10"):
            entry = stored["eps_sweep"][method][epsilon]
            assert 0.0 <= entry["mean"] <= 1.0
            assert len(entry["trials"]) in (1, 2)
    sweep = stored["eps_sweep"]
    assert sweep["nonprivate"]["10"]["mean"] >= sweep["random_guess"]["10"]["mean"]
    assert sweep[key]["10"]["variant"] == "paper"
    assert len(stored["k_sweep"]["bins"]) == len(stored["k_sweep"]["methods"][key])
    report = (tmp_path / "report.md").read_text()
    assert "## epsilon sweep" in report
    assert "| DeepCandidate, paper recipe (sentdp-test) |" in report
    assert "| SentenceVote label (sentdp-test) |" in report
    assert "![k sweep](k_sweep.png)" in report
    assert "sentdp-eval --model x --quick" in report
    paired = results.on_mdp_documents
    assert paired is not None
    assert paired.documents == 8
    assert paired.eps_sweep["word_mdp"] == results.eps_sweep["word_mdp"]
    assert set(paired.eps_sweep) == set(results.methods) - {"random_guess"}
    for epsilon in ("1", "10"):  # the served row follows the same source on the subset
        by_vote = bundle.manifest.choice_for(float(epsilon)).label == "vote"
        source = paired.eps_sweep[vote if by_vote else key][epsilon]
        assert paired.eps_sweep[served][epsilon].trials == source.trials
    assert read_results(tmp_path) == dataclasses.replace(results, command=command)
    assert "### On word-level metric DP's 8 documents" in report


def test_labels_only_rescores_the_label_rows_and_keeps_the_others(quick_bundle_tag: str) -> None:
    bundle = load_from_store(quick_bundle_tag)
    config = EvalConfig(
        trials=2,
        epsilons=(1.0, 10.0),
        k_epsilon=10.0,
        max_test_documents=20,
        mdp_documents=4,
        baselines=("truncation", "word_mdp"),
    )
    settings = load_settings()
    results = run_evaluation([bundle], settings, config, log=lambda _: None)
    name = bundle.manifest.name
    vote, served, key = (f"{p}:{name}" for p in ("sentence_vote", "classify", "deepcandidate"))
    zero = Score.of([0.0, 0.0])
    stale = dataclasses.replace(
        results,
        eps_sweep={
            **results.eps_sweep,
            vote: dict.fromkeys(results.eps_sweep[vote], zero),
            served: dict.fromkeys(results.eps_sweep[served], zero),
        },
    )
    fresh = rescore_labels([bundle], stale, settings, config, log=lambda _: None)
    assert fresh.methods == results.methods
    for method in results.methods:  # the same seeded draws: the label rows come back exactly
        assert fresh.eps_sweep[method] == results.eps_sweep[method], method
    assert fresh.k_sweep.methods[vote] == results.k_sweep.methods[vote]
    assert fresh.on_mdp_documents == results.on_mdp_documents
    assert "re-scored" in fresh.notes[-1]
    moved = {**results.eps_sweep[key], "1": dataclasses.replace(results.score(key, 1.0), p=999)}
    with pytest.raises(ValueError, match="run a full evaluation"):
        rescore_labels(
            [bundle],
            dataclasses.replace(results, eps_sweep={**results.eps_sweep, key: moved}),
            settings,
            config,
        )
    nonprivate = results.eps_sweep["nonprivate"]
    other = {k: dataclasses.replace(v, mean=v.mean + 0.01) for k, v in nonprivate.items()}
    with pytest.raises(ValueError, match="non-private classifier"):
        rescore_labels(
            [bundle],
            dataclasses.replace(results, eps_sweep={**results.eps_sweep, "nonprivate": other}),
            settings,
            config,
        )
    with pytest.raises(ValueError, match="--mdp-documents 4"):
        rescore_labels([bundle], results, settings, dataclasses.replace(config, mdp_documents=5))
    with pytest.raises(ValueError, match="trials"):
        rescore_labels([bundle], results, settings, dataclasses.replace(config, trials=3))


def test_bundles_share_a_vote_row_only_if_they_run_the_same_vote_at_every_epsilon(
    tmp_path: Path,
) -> None:
    """Recipes of one corpus share the SentenceVote row only when every grid epsilon runs
    the same classifier: the same vote 0 with a different vote at epsilon 1 is another row."""
    from evaluation.experiment import _distinct_votes, _same_vote
    from tests.service.fakes import tiny_bundle

    one = tiny_bundle(encoder_dir=tmp_path, vote=True)
    two = tiny_bundle(encoder_dir=tmp_path, vote=True, second_vote=True)
    assert _same_vote(one, tiny_bundle(encoder_dir=tmp_path, vote=True))
    assert np.array_equal(one.votes[0].weights, two.votes[0].weights)  # vote 0 is shared
    assert not _same_vote(one, two)
    assert two.vote_for(0.5) is two.votes[1]  # below the grid: its first entry
    assert two.vote_for(7.0) is two.votes[0]
    distinct = _distinct_votes([one, two, one])
    assert len(distinct) == 2
    assert distinct[0] is one
    assert distinct[1] is two


def test_the_candidate_row_draws_the_rule_the_p_table_names(mean_bundle_tag: str) -> None:
    """sentdp-eval scores what the service serves: at the epsilon the p table draws by the
    clipped mean its predictions are exactly that rule's draws (Tukey depth's with the same
    random words would differ), and below it Tukey depth with p."""
    from evaluation.experiment import _experiment
    from evaluation.results import deepcandidate_method
    from sentdp.encoders import recode

    bundle = load_from_store(mean_bundle_tag)
    config = EvalConfig(trials=3, epsilons=(1.0, 10.0), k_epsilon=10.0, max_test_documents=40)
    run = _experiment([bundle], load_settings(), config, lambda _: None)
    run.deepcandidate(bundle)
    method = deepcandidate_method(bundle.manifest.name)
    choice = bundle.manifest.choice_for(10.0)
    assert choice.radius is not None
    variant = bundle.variant(choice.variant)
    documents = [recode(variant.recoder, run.embeddings.document(i)) for i in run.test]
    labels = variant.candidate_labels()
    drawn = [
        labels[
            variant.mean_mechanism(choice.radius).sample_batch(
                documents, [10.0] * len(documents), run.rng(trial, 10.0, 0)
            )
        ]
        for trial in range(3)
    ]
    predicted = run.on_test[method]["10"]
    assert all(np.array_equal(p, d) for p, d in zip(predicted, drawn, strict=True))
    depth = [
        labels[
            variant.mechanism().sample_batch(
                documents,
                [10.0] * len(documents),
                [variant.record.p_max] * len(documents),
                run.rng(trial, 10.0, 0),
            )
        ]
        for trial in range(3)
    ]
    assert not all(np.array_equal(p, d) for p, d in zip(predicted, depth, strict=True))
    assert run.eps_sweep[method]["10"].p is None
    assert run.eps_sweep[method]["1"].p == bundle.manifest.choice_for(1.0).p
