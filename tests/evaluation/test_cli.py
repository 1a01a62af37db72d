"""sentdp-eval without training: flag defaults, and redrawing the committed reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evaluation.cli import config_from_args, main, parse_args
from evaluation.experiment import EvalConfig
from evaluation.results import EvaluationResults

REPORTS = Path(__file__).resolve().parents[2] / "reports"
COMMITTED = sorted(p.parent.name for p in REPORTS.glob("*/results.json"))


def test_the_flags_default_to_the_config_defaults() -> None:
    assert config_from_args(parse_args(["--model", "m"])) == EvalConfig()
    assert config_from_args(parse_args(["--model", "m", "--quick"])) == EvalConfig().quick()


EVERY_RESULTS = sorted(str(p.relative_to(REPORTS)) for p in REPORTS.rglob("results.json"))


@pytest.mark.parametrize("path", EVERY_RESULTS)
def test_committed_results_read_and_write_back_byte_for_byte(path: str) -> None:
    text = (REPORTS / path).read_text()
    results = EvaluationResults.from_json(json.loads(text))
    assert json.dumps(results.to_json(), indent=2) == text


@pytest.mark.parametrize("corpus", COMMITTED)
def test_render_only_redraws_the_committed_report(corpus: str, tmp_path: Path) -> None:
    out = tmp_path / corpus
    shutil.copytree(REPORTS / corpus, out)
    (out / "report.md").unlink()
    main(["--render-only", "--out", str(out)])
    assert (out / "report.md").read_text() == (REPORTS / corpus / "report.md").read_text()
    assert (out / "results.json").read_text() == (REPORTS / corpus / "results.json").read_text()


def test_render_only_without_results_exits_with_code_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--render-only", "--out", str(tmp_path)])
    assert exit_info.value.code == 2


def test_results_whose_sweep_misses_a_method_are_refused() -> None:
    data = json.loads((REPORTS / COMMITTED[0] / "results.json").read_text())
    del data["eps_sweep"]["word_mdp"]
    with pytest.raises(ValueError, match="epsilon sweep scores"):
        EvaluationResults.from_json(data)


def test_results_that_are_not_sentdp_eval_s_are_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for content in ("{not json", "[]", '{"corpus": 5}'):
        (tmp_path / "results.json").write_text(content)
        with pytest.raises(SystemExit) as exited:
            main(["--render-only", "--out", str(tmp_path)])
        assert exited.value.code == 2
        error = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
        assert "results.json cannot be read as sentdp-eval's results" in error


def test_hand_edited_results_are_a_message_and_the_file_is_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text("[" * 100_000)
    with pytest.raises(SystemExit) as exited:
        main(["--render-only", "--out", str(tmp_path)])
    assert exited.value.code == 2
    data = json.loads((REPORTS / COMMITTED[0] / "results.json").read_text())
    data["eps_sweep"]["word_mdp"]["1"]["mean"] = "x"
    edited = json.dumps(data)
    (tmp_path / "results.json").write_text(edited)
    with pytest.raises(SystemExit) as exited:
        main(["--render-only", "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert "holds results that cannot be drawn" in " ".join(capsys.readouterr().err.split())
    assert (tmp_path / "results.json").read_text() == edited


def test_bad_flags_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    for flags in (
        ["--trials", "0"],
        ["--epsilons", "1", "nan", "--k-epsilon", "1"],
        ["--out", str(tmp_path / "a-file")],
    ):
        with pytest.raises(SystemExit) as exited:
            parse_args(["--model", "m", *flags])
        assert exited.value.code == 2
    assert "cannot be a report folder" in capsys.readouterr().err


def test_a_failed_run_leaves_no_empty_report_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--out is made at parse time (a bad one fails before hours of work); a run that then
    fails removes the folders it made, and only those, and only while they are empty."""
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path / "store"))
    out = tmp_path / "new" / "deeper" / "report"
    with pytest.raises(SystemExit) as exited:
        main(["--model", "no-such-model:v1", "--out", str(out)])
    assert exited.value.code == 2
    assert "no-such-model" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        main(["--model", "no-such-model:v1", "--out", str(kept / "report")])
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    with pytest.raises(SystemExit):
        main(["--render-only", "--out", str(kept)])
    assert kept.is_dir()
    mine = tmp_path / "mine"  # empty, and the user's: not made by the run
    mine.mkdir()
    with pytest.raises(SystemExit):
        main(["--model", "no-such-model:v1", "--out", str(tmp_path / "new" / ".." / "mine")])
    assert mine.is_dir()
