"""``sentdp-eval``: the paper's experiments for a bundle, written as a report folder."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from evaluation.experiment import EvalConfig, rescore_labels, run_evaluation
from evaluation.report import RESULTS, read_results, write_report
from evaluation.results import EvaluationResults
from sentdp.bundle import Bundle
from sentdp.errors import SentDPError
from training.console import plain_console
from training.settings import load_settings
from training.store import load_from_store

DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(EvalConfig)}
"""EvalConfig's defaults, so the flags' defaults cannot drift from the config's."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sentdp-eval",
        description="Macro-F1 of DeepCandidate and the baselines on a bundle's test split.",
    )
    parser.add_argument(
        "--model",
        nargs="+",
        help="BentoML model tag(s) of bundles trained on the same corpus (e.g. the paper's "
        "recipe and a task-tuned one); all are scored on the same test documents",
    )
    parser.add_argument("--out", type=Path, help="report folder (default reports/<corpus>)")
    parser.add_argument(
        "--dataset",
        help="the corpus file, if it is no longer at the path the bundle was trained with "
        "(its sha256 must match the bundle's)",
    )
    parser.add_argument("--trials", type=int, default=DEFAULTS["trials"])
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(DEFAULTS["epsilons"]))
    parser.add_argument("--k-epsilon", type=float, default=DEFAULTS["k_epsilon"])
    parser.add_argument("--mdp-documents", type=int, default=DEFAULTS["mdp_documents"])
    parser.add_argument(
        "--baselines",
        nargs="*",
        choices=["truncation", "word_mdp"],
        default=list(DEFAULTS["baselines"]),
        help="private baselines to run (default both; word_mdp is the slow one)",
    )
    parser.add_argument("--quick", action="store_true", help="2 trials, 20 test documents")
    parser.add_argument(
        "--labels-only",
        action="store_true",
        help=f"score only the label rows (SentenceVote, /classify as served) again, into the "
        f"--out folder's {RESULTS}; every other row is kept",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help=f"only redraw report.md and the plots from the --out folder's {RESULTS}",
    )
    args = parser.parse_args(argv)
    if args.trials < 1 or args.mdp_documents < 1:
        parser.error("--trials and --mdp-documents must be at least 1")
    if not all(0 < e < float("inf") for e in [*args.epsilons, args.k_epsilon]):
        parser.error("--epsilons and --k-epsilon must be finite and above 0")
    args.made_folders = []
    if args.out is not None:
        # made now, not after an evaluation of hours whose results would then be lost; main
        # removes what it made again if the run writes nothing into it
        where = args.out.resolve()  # "new/../mine" would otherwise count "mine" as made
        args.made_folders = [f for f in (where, *where.parents) if not f.exists()][::-1]
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            _remove_empty(args.made_folders)
            parser.error(f"--out {args.out} cannot be a report folder: {error.strerror}")
    return args


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders (outermost first in the list) that are still empty, innermost first."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:  # not empty, or never made
            if folder.exists():
                return


def _read_results(folder: Path, console: Console) -> EvaluationResults:
    """The ``results.json`` of a report folder, or a message naming it."""
    try:
        return read_results(folder)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
        fail(console, f"{folder / RESULTS} cannot be read as sentdp-eval's results: {error!r}")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    config = EvalConfig(
        trials=args.trials,
        epsilons=tuple(sorted(args.epsilons)),
        k_epsilon=args.k_epsilon,
        mdp_documents=args.mdp_documents,
        baselines=tuple(args.baselines),
        dataset=args.dataset,
    )
    return config.quick() if args.quick else config


def _previous_results(
    out: Path | None, bundles: list[Bundle], console: Console
) -> EvaluationResults:
    folder = out or Path("reports") / bundles[0].manifest.corpus.name
    if not (folder / RESULTS).is_file():
        fail(console, f"--labels-only needs a {RESULTS} in {folder} (or --out) to update")
    return _read_results(folder, console)


def fail(console: Console, message: str) -> NoReturn:
    console.print(f"sentdp-eval: {message}", style="red")
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        _run(args, argv)
    finally:
        _remove_empty(args.made_folders)  # a failed or stopped run leaves no empty --out


def _run(args: argparse.Namespace, argv: list[str] | None) -> None:
    console = plain_console()
    if args.render_only:
        if args.out is None or not (args.out / RESULTS).is_file():
            fail(console, f"--render-only needs --out with a {RESULTS}")
        try:
            written = write_report(_read_results(args.out, console), args.out)
        except (ValueError, KeyError, TypeError) as error:  # values sentdp-eval never writes
            fail(console, f"{args.out / RESULTS} holds results that cannot be drawn: {error!r}")
        for path in written:
            console.print(f"wrote {path}")
        return
    if not args.model:
        fail(console, "--model is required (unless --render-only)")
    config = config_from_args(args)
    if config.k_epsilon not in config.epsilons:
        fail(console, "--k-epsilon must be one of --epsilons")
    command = "sentdp-eval " + shlex.join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    try:
        bundles = [load_from_store(tag) for tag in args.model]
        if args.labels_only:
            previous = _previous_results(args.out, bundles, console)
            results = rescore_labels(bundles, previous, load_settings(), config, console.print)
            command = f"{previous.command or 'sentdp-eval (command not recorded)'} && {command}"
        else:
            results = run_evaluation(bundles, load_settings(), config, log=console.print)
    except (SentDPError, FileNotFoundError, ValueError) as error:
        fail(console, str(error))
    results = dataclasses.replace(results, command=command)
    for path in write_report(results, args.out or Path("reports") / results.corpus):
        console.print(f"wrote {path}")
    console.print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
