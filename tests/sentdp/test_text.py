"""Splitting and limits: the privacy unit is the segment the splitter produces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentdp.errors import InputError, LimitError
from sentdp.text import SentenceSplitter, TextLimits, prepare_sentences, split_document

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
    with pytest.raises(LimitError, match="4 sentences, more than the limit of 3"):
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
