"""One table of test macro-F1 per encoder backend, from one ``sentdp-eval`` report per backend.

    python -m evaluation.backend_report torch=reports/bbc-news/backend-torch \\
        onnx=reports/bbc-news/backend-onnx onnx-int8=reports/bbc-news/backend-onnx-int8 \\
        --out reports/bbc-news/backends.md

The first backend is the reference: every other row says how far it is from it, so a user
sees what a faster backend costs. Methods are matched by kind (DeepCandidate's embedding,
SentenceVote, the label /classify serves, the non-private classifier), not by model name.
"""

from __future__ import annotations

import argparse
import json
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


def render(reports: dict[str, dict[str, Any]]) -> str:
    """Markdown: for each method kind, one row per backend, one column per epsilon."""
    first = next(iter(reports.values()))
    epsilons = [float(e) for e in first["epsilons"]]
    scored = {backend: method_scores(results) for backend, results in reports.items()}
    reference = next(iter(scored))
    head = "| method | backend | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |"
    lines = [
        f"# Test macro-F1 per encoder backend: {first['corpus']}",
        "",
        f"{first['test_documents']} test documents, {first['trials']} trials (mean); in "
        f"brackets, the difference from {reference}. Commands: "
        + "; ".join(f"`{r['command']}`" for r in reports.values()),
        "",
        head,
        "|" + "---|" * (len(epsilons) + 2),
    ]
    for kind in KINDS:
        for backend, scores in scored.items():
            if kind not in scores:
                continue
            cells = []
            for e in epsilons:
                value = scores[kind].get(e)
                base = scored[reference].get(kind, {}).get(e)
                if value is None:
                    cells.append("-")
                elif backend == reference or base is None:
                    cells.append(f"{value:.3f}")
                else:
                    cells.append(f"{value:.3f} ({value - base:+.3f})")
            lines.append(f"| {kind} | {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", metavar="BACKEND=FOLDER")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    reports = {}
    for spec in args.reports:
        backend, _, folder = spec.partition("=")
        if not folder:
            parser.error(f"expected BACKEND=FOLDER, got {spec!r}")
        reports[backend] = json.loads((Path(folder) / "results.json").read_text())
    args.out.write_text(render(reports))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
