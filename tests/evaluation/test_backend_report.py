"""The per-backend table: methods matched by kind, differences from the first backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.backend_report import main, render


def results(model: str, shift: float) -> dict[str, object]:
    def sweep(base: float) -> dict[str, dict[str, float]]:
        return {"1.0": {"mean": base + shift}, "3.0": {"mean": base + 0.1 + shift}}

    return {
        "corpus": "bbc-news",
        "test_documents": 317,
        "trials": 5,
        "epsilons": [1.0, 3.0],
        "command": f"sentdp-eval --model {model}",
        "eps_sweep": {
            f"deepcandidate:{model}": sweep(0.5),
            "nonprivate": sweep(0.9),
            "random_guess": sweep(0.2),
        },
    }


def test_rows_per_backend_with_differences_from_the_reference() -> None:
    table = render({"torch": results("a-torch", 0.0), "onnx-int8": results("a-int8", -0.02)})
    assert "| deepcandidate | torch | 0.500 | 0.600 |" in table
    assert "| deepcandidate | onnx-int8 | 0.480 (-0.020) | 0.580 (-0.020) |" in table
    assert "| nonprivate | onnx-int8 | 0.880 (-0.020) | 0.980 (-0.020) |" in table
    assert "random_guess" not in table
    assert "`sentdp-eval --model a-int8`" in table


def test_several_seeds_give_means_and_the_paired_difference_with_its_error() -> None:
    torch = [results("s0-torch", 0.0), results("s1-torch", 0.1)]
    int8 = [results("s0-int8", 0.01), results("s1-int8", 0.07)]  # differences +0.01, -0.03
    table = render({"torch": torch, "onnx-int8": int8})
    # int8 means 0.540 / 0.640; paired differences mean -0.010, sd 0.0283, error 0.020
    assert "| deepcandidate | torch | 0.550 | 0.650 |" in table
    assert (
        "| deepcandidate | onnx-int8 | 0.540 (-0.010 ± 0.020) | 0.640 (-0.010 ± 0.020) |" in table
    )
    assert "mean over 2 bundles per backend" in table
    assert "`sentdp-eval --model s1-int8`" in table


def test_reports_that_cannot_be_paired_are_refused() -> None:
    with pytest.raises(ValueError, match="has 1 reports"):
        render({"torch": [results("a", 0.0), results("b", 0.0)], "onnx": [results("c", 0.0)]})
    other_split = results("c", 0.0) | {"test_documents": 300}
    with pytest.raises(ValueError, match="not on torch's test split"):
        render({"torch": [results("a", 0.0)], "onnx": [other_split]})
    seeds = [results(name, 0.0) | {"split_seed": seed} for name, seed in (("a", 0), ("b", 1))]
    with pytest.raises(ValueError, match="not on torch's test split"):  # seed 0 against seed 1
        render({"torch": seeds, "onnx": seeds[::-1]})
    render({"torch": seeds, "onnx": seeds})
    render({"torch": seeds, "onnx": [results("c", 0.0), results("d", 0.0)]})  # older reports


def test_the_performance_notes_show_the_committed_five_seed_table() -> None:
    root = Path(__file__).resolve().parents[2]
    folder = root / "reports" / "bbc-news" / "backend-seeds"
    runs = {
        backend: [
            json.loads((folder / f"seed{seed}-{backend}" / "results.json").read_text())
            for seed in range(5)
        ]
        for backend in ("torch", "onnx-int8")
    }
    table = render(runs)
    assert table == (root / "reports" / "bbc-news" / "backends-seeds.md").read_text()
    notes = (root / "docs" / "performance.md").read_text()  # linked from the README
    shown = [row for row in table.splitlines() if row.startswith(("| deepcandidate", "| classify"))]
    assert len(shown) == 4
    for row in shown:
        assert row in notes


def test_the_command_line_names_a_bad_folder_instead_of_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text("[1, 2]")
    for folder, message in (("empty", "cannot read"), ("other", "is not a sentdp-eval")):
        with pytest.raises(SystemExit) as stopped:
            main([f"torch={tmp_path / folder}", "--out", str(tmp_path / "table.md")])
        assert stopped.value.code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "table.md").exists()
