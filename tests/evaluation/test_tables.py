"""The comparison scripts' shared command line and Markdown tables."""

from __future__ import annotations

import sys

import pytest

from evaluation import vote_ceiling
from evaluation.tables import print_table, tag_parser
from training.p_selection import DEFAULT_EPSILONS


def test_a_table_is_markdown_with_one_separator_cell_per_column(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_table("bundle x", ["ε", "score"], [["1", "0.500"], ["3", "0.750"]])
    assert capsys.readouterr().out == (
        "\nbundle x\n| ε | score |\n|---|---|\n| 1 | 0.500 |\n| 3 | 0.750 |\n"
    )


def test_the_parser_wants_at_least_one_tag(capsys: pytest.CaptureFixture[str]) -> None:
    parser = tag_parser("prog")
    assert parser.parse_args(["a:1", "b:2"]).tags == ["a:1", "b:2"]
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "TAG" in capsys.readouterr().err


@pytest.mark.slow
def test_the_ceiling_script_prints_a_row_per_split_and_epsilon(
    quick_bundle_tag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["vote_ceiling", quick_bundle_tag])
    vote_ceiling.main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].startswith("| split | ε | true class: flip / table |")
    rows = [line.split(" | ") for line in lines[3:]]
    assert len(rows) == 2 * len(DEFAULT_EPSILONS)
    assert [row[0] for row in rows] == ["| validation"] * len(DEFAULT_EPSILONS) + ["| test"] * len(
        DEFAULT_EPSILONS
    )
    for row in rows:  # "flip / table" for the true class, each a probability
        flip, table = (float(v) for v in row[2].split(" / "))
        assert 0.0 <= flip <= table + 1e-9 <= 1.0 + 1e-9
