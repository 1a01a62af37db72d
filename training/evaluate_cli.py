"""``sentdp-eval``: the paper's experiments for a bundle, written as a report folder."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from rich.console import Console

from sentdp.errors import SentDPError
from training.evaluate import EvalConfig, run_evaluation
from training.p_selection import DEFAULT_EPSILONS
from training.report import write_report
from training.settings import load_settings
from training.store import load_from_store


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="sentdp-eval",
        description="Macro-F1 of DeepCandidate and the baselines on a bundle's test split.",
    )
    parser.add_argument(
        "--model",
        required=True,
        nargs="+",
        help="BentoML model tag(s) of bundles trained on the same corpus (e.g. the paper's "
        "recipe and a task-tuned one); all are scored on the same test documents",
    )
    parser.add_argument("--out", type=Path, help="report folder (default reports/<corpus>)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(DEFAULT_EPSILONS))
    parser.add_argument("--k-epsilon", type=float, default=10.0)
    parser.add_argument("--mdp-documents", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="2 trials, 20 test documents")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="only redraw report.md and the plots from the --out folder's results.json",
    )
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if args.render_only:
        if args.out is None or not (args.out / "results.json").is_file():
            console.print("[red]sentdp-eval: --render-only needs --out with a results.json[/red]")
            sys.exit(2)
        rendered = json.loads((args.out / "results.json").read_text())
        for path in write_report(rendered, args.out, rendered.get("command", "sentdp-eval")):
            console.print(f"wrote {path}")
        return
    config = EvalConfig(
        trials=2 if args.quick else args.trials,
        epsilons=tuple(sorted(args.epsilons)),
        k_epsilon=args.k_epsilon,
        mdp_documents=10 if args.quick else args.mdp_documents,
        max_test_documents=20 if args.quick else None,
    )
    if config.k_epsilon not in config.epsilons:
        console.print("[red]sentdp-eval: --k-epsilon must be one of --epsilons[/red]")
        sys.exit(2)
    try:
        bundles = [load_from_store(tag) for tag in args.model]
        results = run_evaluation(bundles, load_settings(), config, log=console.print)
    except (SentDPError, FileNotFoundError, ValueError) as error:
        console.print(f"[red]sentdp-eval: {error}[/red]")
        sys.exit(2)
    out = args.out or Path("reports") / results["corpus"]
    command = "sentdp-eval " + shlex.join(argv if argv is not None else sys.argv[1:])
    results["command"] = command
    for path in write_report(results, out, command):
        console.print(f"wrote {path}")
    console.print(f"wall time {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
