"""Splitting and limits: the privacy unit is the segment the splitter produces."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentdp.errors import InputError, LimitError
from sentdp.text import (
    SentenceSplitter,
    TextLimits,
    paragraph_spans,
    prepare_sentences,
    segment_spans,
    split_document,
)

GOLD = Path(__file__).parent.parent / "data" / "splitter_gold.jsonl"


@pytest.fixture(scope="module")
def splitter() -> SentenceSplitter:
    return SentenceSplitter()


def test_hand_checked_sample_is_split_correctly(splitter: SentenceSplitter) -> None:
    cases = [json.loads(line) for line in GOLD.read_text().splitlines()]
    exact = sum(splitter.tokenize(c["text"]) == c["sentences"] for c in cases)
    assert exact >= 24, f"only {exact} of {len(cases)} passages split exactly"
    # The known miss merges two sentences (safe); nothing is split inside a sentence.
    for case in cases:
        for produced in splitter.tokenize(case["text"]):
            assert not any(produced != s and produced in s for s in case["sentences"])


def test_titles_and_paragraphs_never_merge(splitter: SentenceSplitter) -> None:
    title = "Ad sales boost Time Warner profit"
    text = f"{title}\n\nQuarterly profits jumped 76%.  The firm was pleased.\n"
    assert splitter.tokenize(text) == [
        "Ad sales boost Time Warner profit",
        "Quarterly profits jumped 76%.",
        "The firm was pleased.",
    ]


def test_spans_point_at_the_sentences_in_the_original_text(splitter: SentenceSplitter) -> None:
    text = "  First one here.  Second one?\n\n  Third!  "
    spans = list(splitter.span_tokenize(text))
    assert [text[a:b] for a, b in spans] == ["First one here.", "Second one?", "Third!"]


def test_long_sentences_are_truncated_and_whitespace_collapsed(splitter: SentenceSplitter) -> None:
    limits = TextLimits(max_sentences=10, max_sentence_chars=12)
    assert split_document("A very   long sentence indeed. Short.", splitter, limits) == [
        "A very long ",
        "Short.",
    ]


def test_too_many_sentences_raise_a_limit_error(splitter: SentenceSplitter) -> None:
    limits = TextLimits(max_sentences=3)
    with pytest.raises(LimitError, match="more than 3 sentences, the limit"):
        split_document("One. Two. Three. Four.", splitter, limits)
    with pytest.raises(LimitError, match="more than the limit"):
        prepare_sentences(["word"] * 10_000, limits)


@pytest.mark.parametrize("text", ["", "   ", "\n\n\n"])
def test_empty_documents_are_refused(splitter: SentenceSplitter, text: str) -> None:
    with pytest.raises(InputError, match="the document is empty"):
        split_document(text, splitter, TextLimits())


def test_presplit_sentences_are_kept_as_units() -> None:
    out = prepare_sentences(["Dr. No.", "  Yes. Really.  "], TextLimits())
    assert out == ["Dr. No.", "Yes. Really."]
    with pytest.raises(InputError, match="sentence 1 is empty"):
        prepare_sentences(["fine", "  "], TextLimits())
    with pytest.raises(InputError, match="sentence 0 must be a string"):
        prepare_sentences([3], TextLimits())  # type: ignore[list-item]


def test_non_string_documents_are_refused(splitter: SentenceSplitter) -> None:
    with pytest.raises(InputError, match="must be a string"):
        split_document(b"bytes", splitter, TextLimits())  # type: ignore[arg-type]


def test_splitter_describes_itself_for_the_bundle(splitter: SentenceSplitter) -> None:
    assert splitter.describe() == {
        "name": "sentdp-left-context",
        "version": "1",
        "paragraphs": "blank lines",
    }


@pytest.mark.timeout(60)
def test_splitting_is_linear_even_for_marks_that_never_end_a_segment(
    splitter: SentenceSplitter,
) -> None:
    # Each of these once took quadratic time (a 96 KB body took ~1 minute); 4 MB now must
    # finish long before the timeout.
    for text in (". " * 2_000_000, "a. " * 1_300_000, "Dr. " * 1_000_000):
        assert len(splitter.tokenize(text)) == 1


def test_nltk_tokenizers_fit_and_ours_keeps_their_interface(splitter: SentenceSplitter) -> None:
    from nltk.tokenize import LineTokenizer
    from nltk.tokenize.api import TokenizerI

    assert split_document("One line\n\nAnother\n", LineTokenizer(), TextLimits()) == [
        "One line",
        "Another",
    ]
    text = "Shares rose. Dr. Smith was pleased!\n\nA new paragraph"
    spans = list(splitter.span_tokenize(text))
    assert [text[a:b] for a, b in spans] == splitter.tokenize(text)
    # NLTK's own helpers built on tokenize/span_tokenize work on our splitter unchanged.
    assert TokenizerI.tokenize_sents(splitter, [text]) == [splitter.tokenize(text)]  # type: ignore[arg-type]


def _paragraph_spans_by_full_scan(text: str) -> list[tuple[int, int]]:
    """The rule as first written: every paragraph between the breaks of one scan visited."""
    spans, start = [], 0
    for match in [*re.finditer(r"\n[ \t\r\f\v]*\n", text), None]:
        end = len(text) if match is None else match.start()
        spans += [(start + a, start + b) for a, b in segment_spans(text[start:end])]
        if match is not None:
            start = match.end()
    return spans


def test_skipping_blank_paragraphs_cuts_every_text_where_a_full_scan_does() -> None:
    pieces = ["a", "Bb.", "x.", " ", "\n", "\n\n", "\t", "\r", "\u2028", "\u00a0", ".", "!", '"']
    pieces += ["Dr.", "U.S.", "?", "\u2026", "é", "\n \n", "\f"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        assert list(paragraph_spans(text, segment_spans)) == _paragraph_spans_by_full_scan(text)


def test_a_refused_document_is_read_only_one_sentence_past_the_limit() -> None:
    read = []

    class Counting(SentenceSplitter):
        def span_tokenize(self, s: str) -> Iterator[tuple[int, int]]:
            for span in super().span_tokenize(s):
                read.append(span)
                yield span

    limits = TextLimits(max_sentences=50)
    for text in ("x.\n\n" * 100_000, "Go home. " * 100_000, "\n\n\u2028" * 100_000 + "One."):
        read.clear()
        try:
            split_document(text, Counting(), limits)
        except LimitError:
            assert len(read) == 51
        else:
            assert read == [(len(text) - 4, len(text))]  # blank paragraphs hold no segment
    segments = []
    list(paragraph_spans("\n\n\u2028" * 10_000, lambda p: segments.append(p) or iter(())))
    assert segments == []  # no blank paragraph is even handed to the segmenter


def test_a_replaced_tokenize_is_what_splits_documents() -> None:
    """Reading spans lazily is an optimisation of sentdp's own rule only: a subclass's
    tokenize (or the audit's naive-splitter mutant, which replaces the class's) is obeyed."""

    class Naive(SentenceSplitter):
        def tokenize(self, s: str) -> list[str]:
            return [part for part in re.split(r"(?<=[.!?])\s+", s.strip()) if part]

    text = "Dr. No went home. He slept."
    assert split_document(text, Naive(), TextLimits()) == ["Dr.", "No went home.", "He slept."]
    patched = SentenceSplitter()
    patched.tokenize = Naive().tokenize  # type: ignore[method-assign]
    assert split_document(text, patched, TextLimits()) == ["Dr.", "No went home.", "He slept."]
    assert split_document(text, SentenceSplitter(), TextLimits()) == [
        "Dr. No went home.",
        "He slept.",
    ]
