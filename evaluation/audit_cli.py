"""``sentdp-audit``: audit a running deployment's epsilon over its API (see evaluation.audit)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rich.console import Console

from evaluation.audit import ExactLoss, adversarial_pairs, audit_pair, http_sampler, write_report
from sentdp.encoders import SentenceEncoder
from training.datasets import bbc_news_texts
from training.settings import load_settings
from training.store import load_from_store


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sentdp-audit", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the deployment, e.g. http://127.0.0.1:3000")
    parser.add_argument("--key-file", type=Path, required=True, help="the audit tenant's API key")
    parser.add_argument("--model", required=True, help="the bundle tag the deployment serves")
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 3.0])
    parser.add_argument("--samples", type=int, default=2000, help="samples per side of a pair")
    parser.add_argument("--pairs", type=int, default=5, help="adversarial pairs from public text")
    parser.add_argument("--batch", type=int, default=16, help="documents per request")
    parser.add_argument("--out", type=Path, default=Path("reports/audit"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    console = Console(stderr=True)
    settings = load_settings()
    bundle = load_from_store(args.model)
    loss = ExactLoss(bundle, SentenceEncoder(bundle.encoder_dir, settings.device))
    texts = [text for _, _, text in bbc_news_texts(settings.cache_dir)]
    sampler = http_sampler(args.url, args.key_file.read_text().strip(), args.batch)
    results = []
    for epsilon in args.epsilon:
        for pair in adversarial_pairs(texts, loss, epsilon, args.pairs):
            result = audit_pair(pair, epsilon, args.samples, sampler, loss)
            console.print(
                f"ε={epsilon:g} {pair.name}: exact {result.exact_epsilon:.3f}, "
                f"lower bound {result.lower_bound:.3f}{' FLAGGED' if result.flagged else ''}"
            )
            results.append(result)
    write_report(results, args.out, shlex.join(["sentdp-audit", *(argv or sys.argv[1:])]))
    console.print(f"report: {args.out / 'audit.md'}")
    if any(r.flagged for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
