"""One table of test macro-F1 per encoder backend, from ``sentdp-eval`` reports per backend.

    python -m evaluation.backend_report torch=reports/bbc-news/backend-torch \\
        onnx=reports/bbc-news/backend-onnx onnx-int8=reports/bbc-news/backend-onnx-int8 \\
        --out reports/bbc-news/backends.md

The first backend is the reference: every other row says how far it is from it, so a user
sees what a faster backend costs. Methods are matched by kind (DeepCandidate's embedding,
SentenceVote, the label /classify serves, the non-private classifier), not by model name.

A backend may name several report folders, comma-separated (``torch=s0-torch,s1-torch``): one
bundle per training seed, paired by position with the reference's folders (the same seed,
hence the same split). Retraining alone moves DeepCandidate by a few hundredths, so one pair
cannot tell a backend's cost from that noise; with several, each cell is the mean over seeds
and the bracket the mean paired difference with its standard error.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

KINDS = ("deepcandidate", "sentence_vote", "classify", "nonprivate")


def method_scores(results: dict[str, Any]) -> dict[str, dict[float, float]]:
    """Mean macro-F1 per method kind and epsilon of one results.json."""
    scores: dict[str, dict[float, float]] = {}
    for method, by_epsilon in results["eps_sweep"].items():
        kind = method.split(":", 1)[0]
        if kind in KINDS:
            scores[kind] = {float(e): float(v["mean"]) for e, v in by_epsilon.items()}
    return scores


def _cell(values: Sequence[float], differences: Sequence[float] | None) -> str:
    """Mean over seeds; with a reference, the mean paired difference (± its standard error
    when there are several seeds)."""
    text = f"{statistics.fmean(values):.3f}"
    if differences is None:
        return text
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return f"{text} ({mean:+.3f})"
    error = statistics.stdev(differences) / math.sqrt(len(differences))
    return f"{text} ({mean:+.3f} ± {error:.3f})"


def _check_pairs(runs: Mapping[str, Sequence[dict[str, Any]]]) -> None:
    """Every backend has one report per reference report, each on the same test split
    (:func:`_same_split`)."""
    reference, base_runs = next(iter(runs.items()))
    for backend, results in runs.items():
        if len(results) != len(base_runs):
            raise ValueError(
                f"{backend} has {len(results)} reports, {reference} has {len(base_runs)}"
            )
        for own, base in zip(results, base_runs, strict=True):
            if not _same_split(own, base):
                raise ValueError(
                    f"{backend}'s report {own['command']!r} is not on {reference}'s test split"
                )


def _same_split(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Same corpus and test-set size, and the same split seed where both reports record it
    (reports written before ``split_seed`` existed are paired by the caller's order alone)."""
    if (one["corpus"], one["test_documents"]) != (other["corpus"], other["test_documents"]):
        return False
    seeds = (one.get("split_seed"), other.get("split_seed"))
    return None in seeds or seeds[0] == seeds[1]


def _row(
    kind: str,
    per_seed: Sequence[dict[str, dict[float, float]]],
    bases: Sequence[dict[str, dict[float, float]]] | None,
    epsilons: Sequence[float],
) -> list[str]:
    """The cells of one method kind for one backend (``bases``: the reference's scores, or
    None for the reference itself)."""
    cells = []
    for e in epsilons:
        values = [scores[kind].get(e) for scores in per_seed]
        if any(v is None for v in values):
            cells.append("-")
            continue
        known = [float(v) for v in values if v is not None]
        base = [scores.get(kind, {}).get(e) for scores in bases] if bases is not None else []
        reference = [float(b) for b in base if b is not None]
        if len(reference) != len(known):  # the reference itself, or a method it lacks
            cells.append(_cell(known, None))
        else:
            cells.append(_cell(known, [v - b for v, b in zip(known, reference, strict=True)]))
    return cells


def render(reports: Mapping[str, dict[str, Any] | Sequence[dict[str, Any]]]) -> str:
    """Markdown: for each method kind, one row per backend, one column per epsilon. Each
    backend gives one results.json or a list of them (one per seed, paired by position)."""
    runs = {b: [r] if isinstance(r, dict) else list(r) for b, r in reports.items()}
    _check_pairs(runs)
    reference = next(iter(runs))
    seeds = len(runs[reference])
    first = runs[reference][0]
    epsilons = [float(e) for e in first["epsilons"]]
    scored = {b: [method_scores(r) for r in results] for b, results in runs.items()}
    if seeds == 1:
        summary = f"in brackets, the difference from {reference}"
    else:
        summary = (
            f"each cell the mean over {seeds} bundles per backend (one per training seed, "
            f"paired by seed); in brackets, the mean paired difference from {reference} ± its "
            "standard error"
        )
    lines = [
        f"# Test macro-F1 per encoder backend: {first['corpus']}",
        "",
        f"{first['test_documents']} test documents, {first['trials']} trials (mean); {summary}. "
        "Commands: " + "; ".join(f"`{r['command']}`" for results in runs.values() for r in results),
        "",
        "| method | backend | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |",
        "|" + "---|" * (len(epsilons) + 2),
    ]
    for kind in KINDS:
        for backend, per_seed in scored.items():
            if all(kind in scores for scores in per_seed):
                bases = None if backend == reference else scored[reference]
                cells = _row(kind, per_seed, bases, epsilons)
                lines.append(f"| {kind} | {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _read(folder: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """A ``sentdp-eval`` folder's results.json, or a usage error that names it."""
    path = folder / "results.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        parser.error(f"cannot read {path}: {error}")
    if not isinstance(results, dict) or "eps_sweep" not in results:
        parser.error(f"{path} is not a sentdp-eval results.json")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", metavar="BACKEND=FOLDER[,FOLDER...]")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    reports: dict[str, list[dict[str, Any]]] = {}
    for spec in args.reports:
        backend, _, folders = spec.partition("=")
        if not folders:
            parser.error(f"expected BACKEND=FOLDER[,FOLDER...], got {spec!r}")
        reports[backend] = [_read(Path(folder), parser) for folder in folders.split(",")]
    try:
        table = render(reports)
    except (ValueError, KeyError, TypeError) as error:
        parser.error(f"cannot tabulate these reports: {error}")
    args.out.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
