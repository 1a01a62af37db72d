"""The README's utility tables equal the committed reports' results.json, cell for cell (each
is a mean over trials, rounded to 3 places): a re-run report with a stale README fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPORA = ("bbc-news", "movie-polarity", "clothing-reviews")
ROWS = {
    "DeepCandidate (the embedding's class), paper recipe": "deepcandidate:sentdp-{c}",
    "DeepCandidate (the embedding's class), mixed recipe": "deepcandidate:sentdp-{c}-mixed",
    "SentenceVote (a label only)": "sentence_vote:sentdp-{c}",
    "/classify as served (mixed bundle)": "classify:sentdp-{c}-mixed",
    "truncation": "truncation",
    "word-level metric DP": "word_mdp",
    "non-private": "nonprivate",
}


def readme_table(corpus: str) -> dict[str, list[str]]:
    """The first table after the README's line that links ``reports/<corpus>/``: each row's
    name (bold and links stripped) and its cells."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if f"(reports/{corpus}/report.md)" in line)
    rows: dict[str, list[str]] = {}
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip().strip("*") for cell in line.strip().strip("|").split("|")]
        name = re.sub(r"\s*\(with the \[.*$", "", re.sub(r"\*\*", "", cells[0]))
        if not set(name) <= {"-"}:  # not the header's rule
            assert name not in rows, f"{corpus}: the README's table shows {name!r} twice"
            rows[name] = cells[1:]
    return rows


@pytest.mark.parametrize("corpus", CORPORA)
def test_the_readme_utility_table_is_the_report_s(corpus: str) -> None:
    results = json.loads((ROOT / "reports" / corpus / "results.json").read_text())
    epsilons = [f"{e:g}" for e in results["epsilons"]]
    table = readme_table(corpus)
    assert table.pop("macro-F1 at ε") == epsilons
    assert set(table) == set(ROWS)  # no row the test does not check
    compared = 0
    for name, method in ROWS.items():
        shown = table[name]
        sweep = results["eps_sweep"][method.format(c=corpus)]
        for epsilon, cell in zip(epsilons, shown, strict=True):
            if cell:  # the non-private row shows its one figure once
                assert cell == f"{sweep[epsilon]['mean']:.3f}", (corpus, name, epsilon)
                compared += 1
    assert compared == 6 * (len(ROWS) - 1) + 1
