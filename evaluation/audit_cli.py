"""``sentdp-audit``: audit a running deployment's epsilon over its API (see evaluation.audit)."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

from evaluation.audit import (
    ExactLoss,
    Pair,
    PairResult,
    RunInfo,
    adversarial_pairs,
    audit_pair,
    http_sampler,
    tenant_accounting,
    text_pairs,
    write_report,
)
from evaluation.experiment import bundle_encoder
from sentdp.accounting import ZCDP
from sentdp.errors import SentDPError
from training.console import plain_console
from training.datasets import bbc_news_texts
from training.settings import load_settings
from training.store import load_from_store


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sentdp-audit", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the deployment, e.g. http://127.0.0.1:3000")
    parser.add_argument("--key-file", type=Path, required=True, help="the audit tenant's API key")
    parser.add_argument("--model", required=True, help="the bundle tag the deployment serves")
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 3.0])
    parser.add_argument(
        "--samples",
        type=int,
        nargs="+",
        default=[8000, 2000],
        help="samples per side of a pair: one number, or one per --epsilon",
    )
    parser.add_argument("--pairs", type=int, default=5, help="adversarial sentence pairs")
    parser.add_argument("--text-pairs", type=int, default=2, help="adversarial raw-text pairs")
    parser.add_argument(
        "--label-pairs", type=int, default=2, help="adversarial pairs for /classify's label"
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="confidence with which all the run's bounds hold together (split over the pairs)",
    )
    parser.add_argument("--batch", type=int, default=16, help="documents per request")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument(
        "--deployment", default="", help="what is audited, for the report (e.g. 'SQLite, CPU')"
    )
    parser.add_argument("--out", type=Path, default=Path("audit-report"))
    args = parser.parse_args(argv)
    if len(args.samples) == 1:
        args.samples *= len(args.epsilon)
    if len(args.samples) != len(args.epsilon):
        parser.error("give one --samples, or one per --epsilon")
    for name, value in (("samples", min(args.samples)), ("batch", args.batch)):
        if value < 1:
            parser.error(f"--{name} must be at least 1")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if not 0 < args.confidence < 1:
        parser.error("--confidence must be between 0 and 1")
    if not args.key_file.is_file():
        parser.error(f"no key file at {args.key_file}")
    try:
        key = args.key_file.read_text(encoding="utf-8-sig").strip()  # a BOM from an editor
    except (OSError, UnicodeDecodeError):
        key = ""
    if not key or not key.isascii() or not all(c.isprintable() and c != " " for c in key):
        # never echoed: a key with a stray line is still a secret
        parser.error(f"{args.key_file} must hold one API key on one line, and nothing else")
    args.key = key
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    console = plain_console()
    try:
        _audit(args, argv, console)
    except SentDPError as error:  # a bad value, an unknown model, an answer that is not sentdp's
        console.print(f"sentdp-audit: {error}", style="red")
        sys.exit(2)


def _audit(args: argparse.Namespace, argv: list[str] | None, console: Console) -> None:
    settings = load_settings()
    bundle = load_from_store(args.model)
    bundle.check_encoder()
    with _http_errors(console, args.url, "/budget"):
        accounting = tenant_accounting(args.url, args.key)
    loss = ExactLoss(
        bundle,
        bundle_encoder(bundle, settings),
        bounded_range=accounting == ZCDP,
    )
    texts = [text for _, _, text in bbc_news_texts(settings.cache_dir)]
    plan: list[tuple[float, int, Pair]] = []
    for epsilon, samples in zip(args.epsilon, args.samples, strict=True):
        pairs = adversarial_pairs(texts, loss, epsilon, args.pairs)
        pairs += text_pairs(texts, loss, epsilon, args.text_pairs)
        if args.label_pairs:
            labelled = adversarial_pairs(
                texts, loss, epsilon, args.label_pairs, endpoint="classify"
            )
            pairs += labelled[: args.label_pairs]
        plan += [(epsilon, samples, pair) for pair in pairs]
    started = time.perf_counter()
    with _http_errors(console, args.url, "a request"):
        results = _run(args, plan, loss, console)
    url = shown_url(args.url)
    words = [w.replace(args.url, url) for w in (sys.argv[1:] if argv is None else argv)]
    run = RunInfo(
        command=shlex.join(["sentdp-audit", *words]),
        deployment=args.deployment or url,
        seconds=round(time.perf_counter() - started, 1),
        documents=sum(2 * samples for _, samples, _ in plan),
        confidence=args.confidence,
    )
    write_report(results, args.out, run)
    console.print(f"report: {args.out / 'audit.md'}")
    if any(r.misfit for r in results):
        console.print(
            "warning: some outcomes do not follow the bundle's exact distribution (MISFIT): "
            "the deployment does not serve --model as the bundle defines it"
        )
    if any(r.flagged for r in results):
        sys.exit(1)


@contextmanager
def _http_errors(console: Console, url: str, what: str) -> Iterator[None]:
    """Refusals and unreachable deployments end the audit with a message (exit status 2)."""
    try:
        yield
    except httpx.HTTPStatusError as error:
        console.print(f"sentdp-audit: the deployment refused {what}: {_reason(error.response)}")
        sys.exit(2)
    except httpx.UnsupportedProtocol:
        console.print(f"sentdp-audit: --url {shown_url(url)} must start with http:// or https://")
        sys.exit(2)
    except httpx.TransportError as error:
        console.print(f"sentdp-audit: cannot reach {shown_url(url)}: {error}")
        sys.exit(2)
    except httpx.DecodingError:
        console.print(f"sentdp-audit: the answer to {what} could not be decoded")
        sys.exit(2)
    except httpx.InvalidURL:  # its message can quote the URL's user-info
        console.print(f"sentdp-audit: --url {shown_url(url)} is not a valid URL")
        sys.exit(2)


def shown_url(url: str) -> str:
    """``url`` for a message or the report: without user-info (``user:password@``), query
    or fragment, which may hold credentials. Cut by hand, not parsed: a password with a raw
    ``/``, ``?`` or ``#`` (or a URL without a scheme) would fool a parser into keeping it."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    rest = re.split(r"[?#]", rest.rpartition("@")[2], maxsplit=1)[0]
    return f"{scheme}{separator}{rest}"


def _reason(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"HTTP {response.status_code} {error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError, RecursionError):
        return f"HTTP {response.status_code}"


def _run(
    args: argparse.Namespace,
    plan: list[tuple[float, int, Pair]],
    loss: ExactLoss,
    console: Console,
) -> list[PairResult]:
    results: list[PairResult] = []
    columns = (*Progress.get_default_columns()[:2], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeRemainingColumn(), console=console) as progress:
        total = sum(2 * samples for _, samples, _ in plan)
        task = progress.add_task("privatizing", total=total)
        key = args.key
        samplers = {
            endpoint: http_sampler(
                args.url,
                key,
                args.batch,
                args.concurrency,
                lambda n: progress.advance(task, n),
                labels,
            )
            for endpoint, labels in (("privatize", None), ("classify", loss.bundle.labels))
        }
        each = 1 - (1 - args.confidence) / len(plan)  # Bonferroni over the pairs
        for epsilon, samples, pair in plan:
            sampler = samplers[pair.endpoint]
            result = audit_pair(pair, epsilon, samples, sampler, loss, confidence=each)
            spread = (
                ""
                if result.range_lower_bound is None
                else f", range lower bound {result.range_lower_bound:.3f}"
            )
            progress.console.print(
                f"ε={epsilon:g} {pair.name}: exact {result.exact_epsilon:.3f}, "
                f"lower bound {result.lower_bound:.3f}{spread}, fit p {result.fit_pvalue:.3g}"
                f"{' FLAGGED' if result.flagged else ''}{' MISFIT' if result.misfit else ''}"
            )
            results.append(result)
    return results


if __name__ == "__main__":
    main()
