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
