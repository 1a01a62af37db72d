"""The raw-text unit survives replacement: on real BBC News articles, replacing one segment by
a segment of another article changes that segment only, and never k."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from sentdp.text import SentenceSplitter, ends_sentence

SPLITTER = SentenceSplitter()


@pytest.fixture(scope="module")
def articles() -> list[str]:
    from training.datasets import bbc_news_texts

    cache = Path(os.environ["SENTDP_CACHE_DIR"])
    return [text for _, _, text in bbc_news_texts(cache)]


def segments_with_context(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, closes its paragraph) of every segment of ``text``."""
    spans = list(SPLITTER.span_tokenize(text))
    out = []
    for n, (start, end) in enumerate(spans):
        gap = text[end : spans[n + 1][0]] if n + 1 < len(spans) else ""
        out.append((start, end, n + 1 == len(spans) or gap.count("\n") >= 2))
    return out


def test_replacing_one_segment_keeps_every_other_segment(articles: list[str]) -> None:
    rng = random.Random(7)
    pool = []  # (segment, ends at a sentence mark by its own text)
    for text in rng.sample(articles, 300):
        for start, end, closes in segments_with_context(text):
            pool.append((text[start:end], not closes))
    self_ending = [segment for segment, ended in pool if ended]
    checked = 0
    for text in rng.sample(articles, 400):
        spans = segments_with_context(text)
        original = [text[a:b] for a, b, _ in spans]
        for _ in range(5):
            j = rng.randrange(len(spans))
            start, end, closes = spans[j]
            candidates = [s for s, _ in pool] if closes else self_ending
            replacement = rng.choice(candidates)
            edited = text[:start] + replacement + text[end:]
            expected = [*original[:j], replacement, *original[j + 1 :]]
            assert SPLITTER.tokenize(edited) == expected, (j, replacement)
            checked += 1
    assert checked == 2000


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            "He moved to the U.S. He liked it. They left.",
            "He moved to the U.S. it was cold. They left.",
        ),
        ("Sales at Acme Inc. Fell. Then rose.", "Sales at Acme Inc. fell. Then rose."),
        ("He met Dr. Who. She left.", "He met Dr. who. She left."),
    ],
)
def test_the_look_ahead_cases_of_punkt_do_not_re_cut_the_previous_sentence(
    before: str, after: str
) -> None:
    first, second = SPLITTER.tokenize(before), SPLITTER.tokenize(after)
    assert len(first) == len(second)
    assert first[-1] == second[-1]


def test_the_end_decision_reads_the_segment_only() -> None:
    assert ends_sentence("The price rose by 4.99", ".")
    assert ends_sentence("He said it", '."')
    assert not ends_sentence("It was at 10 a.m", ".")
    assert not ends_sentence("She met Mr", ".")
    assert not ends_sentence("The film stars J", ".")
    assert not ends_sentence('"Why', '?"')
    assert ends_sentence("Why", "?")
    assert not ends_sentence("I loved it", "...")


def test_the_word_before_a_spaced_mark_is_still_the_word_before_it() -> None:
    # Tokenized text puts a space before the dot: "lt ." is still the abbreviation "lt".
    assert SPLITTER.tokenize("he plays lt . col . tall . then leaves .") == [
        "he plays lt . col . tall .",
        "then leaves .",
    ]
    assert ends_sentence("he plays lt ", ".") is False
