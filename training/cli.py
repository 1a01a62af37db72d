"""``sentdp-train``: train a bundle on a public corpus and save it to the BentoML store."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from sentdp.encoders import ENCODER_BACKENDS
from sentdp.errors import SentDPError
from training.console import plain_console
from training.datasets import REGISTRY
from training.pipeline import TrainConfig, TrainReport, run_training
from training.settings import load_settings
from training.stops import Stops
from training.variants import RECIPES

DEFAULTS: dict[str, Any] = {
    f.name: f.default
    for f in dataclasses.fields(TrainConfig)
    if f.default is not dataclasses.MISSING
}
"""TrainConfig's defaults, so the flags' defaults cannot drift from the config's."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sentdp-train",
        description="Train H, F, V, the classifiers and the p table on a public corpus; save "
        "them as a versioned BentoML model.",
    )
    parser.add_argument(
        "--dataset", required=True, help=f"one of {sorted(REGISTRY)} or a CSV/JSONL file"
    )
    parser.add_argument("--out", help="BentoML model name[:version] (default sentdp-<corpus>)")
    parser.add_argument("--quick", action="store_true", help="small slice, for tests and demos")
    parser.add_argument(
        "--seed", type=int, default=DEFAULTS["seed"], help="split, k-means, H and V seed"
    )
    parser.add_argument(
        "--recipe",
        default=DEFAULTS["recipe"],
        choices=list(RECIPES),
        help="paper: the unsupervised recipe (default, general purpose); label and vote: "
        "compact label-tuned variants; mixed: all of them. The p table picks a variant per "
        "epsilon on validation.",
    )
    parser.add_argument(
        "--label-dims",
        type=int,
        nargs="+",
        help="dimensions of the label-tuned variants (default 1 2 4 for two classes, else 2 4 8)",
    )
    parser.add_argument(
        "--prototypes",
        type=int,
        nargs="*",
        default=list(DEFAULTS["prototypes"]),
        metavar="K",
        help="per-class sizes of the smaller candidate sets (k-means prototypes) made for every "
        "variant except with the paper recipe; none with the flag alone (default %(default)s)",
    )
    parser.add_argument(
        "--clusters",
        type=int,
        default=DEFAULTS["n_clusters"],
        help="k-means clusters n_c (default %(default)s)",
    )
    parser.add_argument(
        "--candidates",
        type=int,
        default=DEFAULTS["max_candidates"],
        help="at most m candidates (default %(default)s)",
    )
    grid = " ".join(f"{e:g}" for e in DEFAULTS["epsilons"])
    parser.add_argument(
        "--epsilons", type=float, nargs="+", help=f"epsilon grid for the p table (default {grid})"
    )
    parser.add_argument(
        "--encoder-backend",
        choices=ENCODER_BACKENDS,
        default="torch",
        help="how G runs in training and serving: torch, ONNX Runtime float32, or ONNX "
        "Runtime with static int8 (default %(default)s)",
    )
    parser.add_argument(
        "--vote-rule",
        choices=("by-count", "flip"),
        default="by-count",
        help="how /classify's vote is drawn: by-count uses the document's sentence count "
        "(sharper for short documents; bundle format 5), flip is permute-and-flip at every "
        "length, as older bundles (default %(default)s)",
    )
    parser.add_argument(
        "--vote-shape",
        choices=("both", "simplex"),
        default="both",
        help="the votes validation may choose per epsilon: both lets it pick votes in the cube "
        "(a sentence's likeliest class gets all its units; bundle format 7) where they score "
        "better, simplex keeps softmax votes only, as older bundles (default %(default)s)",
    )
    parser.add_argument(
        "--selection",
        choices=("recipe", "depth", "both"),
        default="recipe",
        help="candidate selection rules the p table may pick per epsilon: depth (Tukey depth, "
        "the paper's), both (also distance to the clipped mean; bundle format 6 when chosen), "
        "or recipe: depth for the paper recipe, both for the others (default %(default)s)",
    )
    parser.add_argument("--per-class", type=int, help="use at most this many documents per class")
    parser.add_argument("--text-column", default=DEFAULTS["text_column"])
    parser.add_argument("--label-column", default=DEFAULTS["label_column"])
    parser.add_argument(
        "--corpus-is-public",
        action="store_true",
        help="required for a user corpus: its documents are released verbatim as candidates",
    )
    args = parser.parse_args(argv)
    _check_ranges(parser, args)
    return args


SEED_LIMIT = 2**32
"""NumPy's seeds are below this."""


def _check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse values that could only fail after the corpus is encoded (argparse's exit 2)."""
    for flag, values in (
        ("--clusters", [args.clusters]),
        ("--candidates", [args.candidates]),
        ("--label-dims", args.label_dims or []),
        ("--prototypes", args.prototypes),
        ("--per-class", [] if args.per_class is None else [args.per_class]),
    ):
        if any(value < 1 for value in values):
            parser.error(f"{flag} must be at least 1")
    if args.out is not None and not args.out.strip():
        parser.error("--out is empty: give a model name, or leave --out out for sentdp-<corpus>")
    if not 0 <= args.seed < SEED_LIMIT:
        parser.error(f"--seed must be in [0, {SEED_LIMIT})")
    if args.epsilons and not all(0 < e < float("inf") for e in args.epsilons):
        parser.error("--epsilons must be finite and above 0")
    if args.epsilons and len(set(args.epsilons)) != len(args.epsilons):
        parser.error("--epsilons lists a value twice")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    config = TrainConfig(
        dataset=args.dataset,
        name=args.out,
        seed=args.seed,
        recipe=args.recipe,
        label_dims=tuple(args.label_dims) if args.label_dims else None,
        prototypes=tuple(args.prototypes),
        n_clusters=args.clusters,
        max_candidates=args.candidates,
        per_class=args.per_class,
        text_column=args.text_column,
        label_column=args.label_column,
        corpus_is_public=args.corpus_is_public,
        encoder_backend=args.encoder_backend,
        vote_by_count=args.vote_rule == "by-count",
        vote_shapes=("simplex", "cube") if args.vote_shape == "both" else ("simplex",),
        mean_selection=None if args.selection == "recipe" else args.selection == "both",
    )
    if args.quick:
        config = config.quick()
    if args.epsilons:
        config = dataclasses.replace(config, epsilons=tuple(sorted(args.epsilons)))
    return config


def print_report(report: TrainReport, console: Console) -> None:
    scores = report.scores["validation_macro_f1"]
    table = Table(title=f"{report.tag}: validation macro-F1")
    table.add_column("method")
    table.add_column("epsilon", justify="right")
    table.add_column("variant")
    table.add_column("rule", justify="right")
    table.add_column("macro-F1", justify="right")
    table.add_row("C_nonpriv (plain G means)", "-", "-", "-", f"{scores['nonprivate']:.3f}")
    for choice in report.bundle.manifest.p_table:
        table.add_row(
            "DeepCandidate (expected)",
            f"{choice.epsilon:g}",
            choice.variant,
            choice.rule(),
            f"{choice.validation_macro_f1:.3f}",
        )
    for choice in report.bundle.manifest.p_table:
        if choice.vote_macro_f1 is not None:
            table.add_row(
                "SentenceVote label (expected)",
                f"{choice.epsilon:g}",
                "/classify" if choice.label == "vote" else "-",
                "-",
                f"{choice.vote_macro_f1:.3f}",
            )
    console.print(table)
    other = report.seconds_total - report.seconds_encoding
    share = report.seconds_encoding / report.seconds_total if report.seconds_total else 0.0
    console.print(
        f"wall time {report.seconds_total:.1f} s: encoding {report.seconds_encoding:.1f} s "
        f"({share:.0%}{', cached' if report.embeddings_from_cache else ''}), "
        f"everything else {other:.1f} s"
    )
    console.print(f"saved BentoML model {report.tag}")


def main(argv: list[str] | None = None) -> None:
    console = plain_console()
    args = parse_args(argv)
    stops = Stops()
    stops.install()
    try:
        try:
            report = run_training(config_from_args(args), load_settings(), console, stops.saving())
        except SentDPError as error:
            console.print(f"sentdp-train: {error}", style="red")
            sys.exit(2)
        print_report(report, console)
        if stops.ignored:
            console.print("a stop signal came after the model was saved; the run is complete")
        print(report.tag)
    finally:
        stops.restore()


if __name__ == "__main__":
    main()
