"""Documents to sentences: the privacy unit is a segment exactly as produced here.

**The unit.** Text is cut at blank lines (paragraphs never merge), then each paragraph left to
right: a segment ends at a sentence-final mark (``.``, ``!``, ``?``, optionally followed by
closing quotes or brackets) followed by whitespace or the end of the paragraph, when the
segment's *own* characters say it is an end (:func:`ends_sentence`). The decision never looks
at the next segment, nor at earlier ones, only at the current segment's text, and the one
character after the mark only needs to be whitespace. Hence, for neighbouring documents that
differ in one segment, every other segment, and k, are the same: replacing segment j by any
segment r keeps the split when r ends at a sentence-final mark (every segment not at the end
of a paragraph does), or when segment j ended its paragraph. Splitters that look ahead (Punkt,
nupunkt) re-cut the previous sentence when the next one changes ("...the U.S. He..." vs
"...the U.S. it...").

**The rule.** A ``.`` ends a segment unless the word before it is a known abbreviation that
rarely ends a sentence (titles, months, "vs", "approx", "Inc"...), a single letter (an
initial), or a dotted acronym ("U.S", "a.m", "e.g", "Ph.D"). ``!`` and ``?`` end it unless a
closing quote follows (``"Why?" she asked``). An ellipsis never ends it, nor does a mark
in a segment with no letter or digit yet (". . ." in tokenized text). Every doubtful case
merges: merging is the safe error (a merged segment is protected as one unit), whereas a split
inside a sentence would let that sentence span two units. Measured against nupunkt on the
hand-checked passages and on the real corpora in ``reports/splitters.md``.

Limits: a sentence longer than ``max_sentence_chars`` is truncated (a function of that
sentence alone, so still private); a document with more than ``max_sentences`` segments is
refused (k is public anyway).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from sentdp.errors import InputError, LimitError

_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
_SPACE = re.compile(r"\s+")
_NON_SPACE = re.compile(r"\S")


@dataclass(frozen=True)
class TextLimits:
    """Per-document size limits applied before anything is encoded."""

    max_sentences: int = 2000
    max_sentence_chars: int = 2000

    def __post_init__(self) -> None:
        if self.max_sentences < 1 or self.max_sentence_chars < 1:
            raise InputError(f"text limits must be positive, got {self}")


_ABBREVIATION_WORDS = """
    mr mrs ms messrs dr prof sr jr st gen col capt lt sgt cpl rev hon gov sen rep pres supt
    det insp cmdr adm maj brig
    jan feb mar apr jun jul aug sep sept oct nov dec
    vs approx est dept fig figs vol vols pp ch sec nos op cf al ca inc ltd corp bros mt ft
    ave rd blvd
"""
ABBREVIATIONS = frozenset(_ABBREVIATION_WORDS.split())
"""Words (lowercase, without their final dot) after which a ``.`` does not end a segment."""

_CANDIDATE = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019\u00bb)\]]*(?=\s|$)")
_CLOSERS = "\"'\u201d\u2019\u00bb)]"
_QUOTES = "\"'\u201d\u2019\u00bb"
_WORD_EDGES = "\"'\u201c\u201d\u2018\u2019\u00ab\u00bb([{)]}"
_ACRONYM = re.compile(r"(?:[A-Za-z]{1,2}\.)+[A-Za-z]{1,2}")
_ALNUM = re.compile(r"[^\W_]")


def ends_sentence(segment_so_far: str, mark: str) -> bool:
    """Whether ``mark`` (end punctuation and closers, followed by whitespace) ends the segment
    whose text so far is ``segment_so_far``: a function of the segment's own text alone."""
    words = segment_so_far.split()
    return _ends(words[-1] if words else "", _ALNUM.search(segment_so_far) is not None, mark)


def _ends(last_word: str, has_alnum: bool, mark: str) -> bool:
    core = mark.rstrip(_CLOSERS)
    closers = mark[len(core) :]
    if "\u2026" in core or ".." in core or not has_alnum:
        return False
    if "!" in core or "?" in core:
        return not any(c in _QUOTES for c in closers)
    word = last_word.strip(_WORD_EDGES)
    if word.lower() in ABBREVIATIONS:
        return False
    if len(word) == 1 and word.isalpha():
        return False
    return not _ACRONYM.fullmatch(word)


def last_word(text: str, start: int, end: int) -> str:
    """``text[start:end].split()[-1]`` (or ""), scanning back from ``end`` only as far as the
    word reaches: the last word before a mark, even with whitespace between them."""
    word_end = end
    while word_end > start and text[word_end - 1].isspace():
        word_end -= 1
    word_start = word_end
    while word_start > start and not text[word_start - 1].isspace():
        word_start -= 1
    return text[word_start:word_end]


def segment_spans(paragraph: str) -> Iterator[tuple[int, int]]:
    """Spans of the segments of one paragraph, decided left to right (see the module).

    Linear in the paragraph's length: each character is scanned a bounded number of times
    (the last word before a mark never reaches back past the previous mark).
    """
    size = len(paragraph)
    start = scanned = size - len(paragraph.lstrip())
    has_alnum = False
    for match in _CANDIDATE.finditer(paragraph):
        if match.start() < start:
            continue
        if not has_alnum:
            has_alnum = _ALNUM.search(paragraph, scanned, match.start()) is not None
            scanned = match.start()
        if _ends(last_word(paragraph, start, match.start()), has_alnum, match.group()):
            yield start, match.end()
            start = match.end()
            while start < size and paragraph[start].isspace():
                start += 1
            scanned, has_alnum = start, False
    if paragraph[start:].strip():
        yield start, len(paragraph.rstrip())


def paragraph_spans(
    text: str, segment: Callable[[str], Iterable[tuple[int, int]]]
) -> Iterator[tuple[int, int]]:
    """Spans in ``text`` of ``segment``'s spans within each paragraph (cut at blank lines).

    Paragraphs of whitespace alone are skipped, not visited (they hold no segment), and each
    paragraph starts at its first non-space character (``segment`` strips leading space
    anyway). A break cannot contain that character, so the breaks found from there are the
    ones a scan from the start of the text finds: the spans are the same, and the work
    done per paragraph is bounded by the segments it yields, however many blank lines an
    input holds."""
    position = 0
    while (first := _NON_SPACE.search(text, position)) is not None:
        start = first.start()
        match = _PARAGRAPH_BREAK.search(text, start)
        end = len(text) if match is None else match.start()
        for left, right in segment(text[start:end]):
            yield start + left, start + right
        if match is None:
            return
        position = match.end()


class Tokenizer(Protocol):
    """What :func:`split_document` needs of a splitter: NLTK's ``TokenizerI.tokenize``, so
    any NLTK tokenizer fits. A protocol rather than NLTK's base class: importing ``nltk``
    imports SciPy's statistics (~100 MiB and 0.6 s in every server process)."""

    def tokenize(self, s: str) -> list[str]: ...


class SentenceSplitter:
    """Paragraphs, then left-context segments, with NLTK's tokenizer interface
    (``tokenize`` and ``span_tokenize``)."""

    name = "sentdp-left-context"
    version = "1"

    def describe(self) -> dict[str, str]:
        """Name and version of the rule, recorded in a model bundle."""
        return {"name": self.name, "version": self.version, "paragraphs": "blank lines"}

    def span_tokenize(self, s: str) -> Iterator[tuple[int, int]]:
        """Character spans of the segments of ``s``, stripped of surrounding whitespace."""
        return paragraph_spans(s, segment_spans)

    def tokenize(self, s: str) -> list[str]:
        return [s[left:right] for left, right in self.span_tokenize(s)]


_OWN_TOKENIZE = SentenceSplitter.tokenize
"""The rule as defined here: a replaced ``tokenize`` (a subclass's, a test's mutant of the
class, or one set on an instance) is called as it is, never bypassed by reading spans."""


def _clean(sentence: str, limits: TextLimits) -> str:
    return _SPACE.sub(" ", sentence).strip()[: limits.max_sentence_chars]


def _check_count(count: int, limits: TextLimits) -> None:
    if count == 0:
        raise InputError("the document is empty: it has no sentence with any text")
    if count > limits.max_sentences:
        raise LimitError(
            f"the document has {count} sentences, more than the limit of {limits.max_sentences}"
        )


def split_document(text: str, splitter: Tokenizer, limits: TextLimits) -> list[str]:
    """Split raw text into cleaned sentences, enforcing the limits. sentdp's own splitter is
    read lazily and stops one sentence past the limit, so a refused document costs no more
    than the largest accepted one."""
    if not isinstance(text, str):
        raise InputError(f"a document must be a string, got {type(text).__name__}")
    pieces: Iterable[str]
    own = getattr(splitter.tokenize, "__func__", None) is _OWN_TOKENIZE
    if own and isinstance(splitter, SentenceSplitter):
        # sentdp's tokenize is the list of these spans: read them lazily
        pieces = (text[left:right] for left, right in splitter.span_tokenize(text))
    else:
        pieces = splitter.tokenize(text)
    sentences: list[str] = []
    for piece in pieces:
        if cleaned := _clean(piece, limits):
            sentences.append(cleaned)
            if len(sentences) > limits.max_sentences:
                raise LimitError(
                    f"the document has more than {limits.max_sentences} sentences, the limit"
                )
    _check_count(len(sentences), limits)
    return sentences


def prepare_sentences(sentences: Sequence[str], limits: TextLimits) -> list[str]:
    """Accept a client's pre-split sentences as they are: each one is a privacy unit."""
    _check_count(len(sentences), limits)
    cleaned = []
    for position, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise InputError(f"sentence {position} must be a string, got {type(sentence).__name__}")
        text = _clean(sentence, limits)
        if not text:
            raise InputError(f"sentence {position} is empty; remove it or give it text")
        cleaned.append(text)
    return cleaned
