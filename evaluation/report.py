"""Evaluation results to files: results.json, report.md and the two plots of the paper."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from evaluation.results import (
    DEEPCANDIDATE,
    SERVED,
    VOTE,
    EvaluationResults,
    Score,
    epsilon_key,
)

LABELS = {
    "truncation": "Truncation (SentDP)",
    "word_mdp": "Word-level metric DP",
    "nonprivate": "Non-private",
    "random_guess": "Random guess",
}
DEEPCANDIDATE_COLORS = ("tab:blue", "tab:purple", "tab:red", "tab:cyan")
VOTE_COLORS = ("tab:brown", "tab:pink", "tab:olive")
STYLES = {
    "truncation": ("tab:orange", "s", "-"),
    "word_mdp": ("tab:green", "^", "-"),
    "nonprivate": ("black", "", "--"),
    "random_guess": ("gray", "", ":"),
}


RESULTS = "results.json"


def read_results(out: Path) -> EvaluationResults:
    """The results a report folder holds (what ``--render-only`` redraws from)."""
    return EvaluationResults.from_json(json.loads((out / RESULTS).read_text()))


def write_report(results: EvaluationResults, out: Path) -> list[Path]:
    """Write results.json, report.md and both plots into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    # Everything is drawn before any of it replaces the folder's files: results that cannot
    # be drawn (a hand-edited results.json) leave the report as it was.
    markdown = _markdown(results)
    plots = {"eps_sweep.png": _eps_plot(results), "k_sweep.png": _k_plot(results)}
    for name, png in plots.items():
        (out / name).write_bytes(png)
    (out / RESULTS).write_text(json.dumps(results.to_json(), indent=2))
    (out / "report.md").write_text(markdown)
    return [out / RESULTS, out / "report.md", *(out / name for name in plots)]


def label_of(method: str, results: EvaluationResults) -> str:
    if method.startswith(DEEPCANDIDATE):
        name = method.removeprefix(DEEPCANDIDATE)
        return f"DeepCandidate, {results.models[name]} recipe ({name})"
    if method.startswith(VOTE):
        return f"SentenceVote label ({method.removeprefix(VOTE)})"
    if method.startswith(SERVED):
        return f"/classify label as served ({method.removeprefix(SERVED)})"
    return LABELS[method]


def style_of(method: str, results: EvaluationResults) -> tuple[str, str, str]:
    if method.startswith(DEEPCANDIDATE):
        rank = [m for m in results.methods if m.startswith(DEEPCANDIDATE)].index(method)
        return DEEPCANDIDATE_COLORS[rank % len(DEEPCANDIDATE_COLORS)], "o", "-"
    if method.startswith(VOTE):
        rank = [m for m in results.methods if m.startswith(VOTE)].index(method)
        return VOTE_COLORS[rank % len(VOTE_COLORS)], "D", "-."
    if method.startswith(SERVED):
        rank = [m for m in results.methods if m.startswith(SERVED)].index(method)
        return VOTE_COLORS[rank % len(VOTE_COLORS)], "*", ":"
    return STYLES[method]


def _cell(entry: Score | None) -> str:
    if entry is None:
        return "n/a"
    return f"{entry.mean:.3f} ± {entry.sd:.3f}"


def _command(results: EvaluationResults) -> str:
    return "sentdp-eval" if results.command is None else results.command


def _markdown(results: EvaluationResults) -> str:
    eps = [epsilon_key(e) for e in results.epsilons]
    lines = [
        f"# {results.corpus}: macro-F1 on the test split",
        "",
        f"{results.test_documents} test documents, {results.trials} trials per "
        f"method and epsilon (mean ± sd). Wall time {results.seconds:.0f} s.",
        "",
        f"Reproduce: `{_command(results)}`",
        "",
        "## epsilon sweep",
        "",
        "| method | " + " | ".join(f"ε={e}" for e in eps) + " |",
        "|---|" + "---|" * len(eps),
    ]
    for method in results.methods:
        row = results.eps_sweep[method]
        lines.append(
            f"| {label_of(method, results)} | " + " | ".join(_cell(row.get(e)) for e in eps) + " |"
        )
    lines.append("")
    for method in results.methods:
        if method.startswith(DEEPCANDIDATE):
            chosen = [results.eps_sweep[method][e] for e in eps]
            ps = [c.variant if c.p is None else f"{c.variant} p={c.p}" for c in chosen]
            lines.append(
                f"- {label_of(method, results)}: variant and rule chosen on validation per ε: "
                + ", ".join(f"ε={e}: {p}" for e, p in zip(eps, ps, strict=True))
            )
        elif method.startswith(SERVED):
            sources = [
                "SentenceVote" if c.variant == "sentence-vote" else f"candidate ({c.variant})"
                for c in (results.eps_sweep[method][e] for e in eps)
            ]
            lines.append(
                f"- {label_of(method, results)}: label source chosen on validation per ε: "
                + ", ".join(f"ε={e}: {s}" for e, s in zip(eps, sources, strict=True))
            )
    lines.append("")
    lines += _paired_table(results, eps)
    lines += [
        "![epsilon sweep](eps_sweep.png)",
        "",
        f"## k sweep at ε = {results.k_epsilon:g}",
        "",
        "| method | " + " | ".join(f"k {b}" for b in results.k_sweep.bins) + " |",
        "|---|" + "---|" * len(results.k_sweep.bins),
    ]
    for method, rows in results.k_sweep.methods.items():
        label = label_of(method, results)
        lines.append(f"| {label} | " + " | ".join(_cell(r) for r in rows) + " |")
    counts = results.k_sweep.methods[results.methods[0]]
    lines.append(
        "| documents per bin | "
        + " | ".join(str(r.documents) if r else "<5" for r in counts)
        + " |"
    )
    lines += ["", "![k sweep](k_sweep.png)", ""]
    if results.notes:
        lines += ["## Notes", ""] + [f"- {note}" for note in results.notes] + [""]
    return "\n".join(lines)


def _paired_table(results: EvaluationResults, eps: list[str]) -> list[str]:
    """Every method again on word-level metric DP's documents: the paired comparison."""
    paired = results.on_mdp_documents
    if paired is None:
        return []
    lines = [
        f"### On word-level metric DP's {paired.documents} documents",
        "",
        f"Word-level metric DP scores {paired.documents} of the {results.test_documents} test "
        "documents. Every method again on those only, from the same predictions (a paired "
        "comparison; the table above scores each method on all the documents it ran on):",
        "",
        "| method | " + " | ".join(f"ε={e}" for e in eps) + " |",
        "|---|" + "---|" * len(eps),
    ]
    for method in results.methods:
        row = paired.eps_sweep.get(method)
        if row is not None:
            cells = " | ".join(_cell(row.get(e)) for e in eps)
            lines.append(f"| {label_of(method, results)} | {cells} |")
    return [*lines, ""]


def _axes() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.0, 4.0), dpi=120)
    return figure, axes


def _eps_plot(results: EvaluationResults) -> bytes:
    figure, axes = _axes()
    eps = list(results.epsilons)
    for method in results.methods:
        means = [results.score(method, e).mean for e in eps]
        sds = [results.score(method, e).sd for e in eps]
        color, marker, line = style_of(method, results)
        label = label_of(method, results)
        axes.plot(eps, means, marker=marker, linestyle=line, color=color, label=label)
        axes.fill_between(
            eps,
            [m - s for m, s in zip(means, sds, strict=True)],
            [m + s for m, s in zip(means, sds, strict=True)],
            color=color,
            alpha=0.15,
        )
    axes.set_xscale("log")
    axes.set_xticks(eps, [f"{e:g}" for e in eps])
    axes.set_xlabel("ε")
    return _finish(figure, axes, f"{results.corpus}: sweep ε")


def _k_plot(results: EvaluationResults) -> bytes:
    figure, axes = _axes()
    bins = results.k_sweep.bins
    for method, rows in results.k_sweep.methods.items():
        points = [(n, r) for n, r in enumerate(rows) if r is not None]
        if not points:
            continue
        color, marker, line = style_of(method, results)
        axes.errorbar(
            [n for n, _ in points],
            [r.mean for _, r in points],
            yerr=[r.sd for _, r in points],
            marker=marker,
            linestyle=line,
            color=color,
            label=label_of(method, results),
            capsize=3,
        )
    axes.set_xticks(range(len(bins)), bins)
    axes.set_xlabel("sentences per document (k)")
    title = f"{results.corpus}: sweep k at ε = {results.k_epsilon:g}"
    return _finish(figure, axes, title)


def _finish(figure: Any, axes: Any, title: str) -> bytes:
    axes.set_ylabel("macro-F1 (test)")
    axes.set_ylim(0, 1.02)
    axes.set_title(title)
    axes.legend(fontsize=8)
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    return png.getvalue()
