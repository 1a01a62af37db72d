"""Which corpus to load, and loading it: shared by training and by evaluation.

Evaluation rebuilds a bundle's corpus from the same :class:`CorpusSpec` that training used
(recorded in the manifest), so both see the same documents and the same splits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sentdp.errors import InputError
from sentdp.text import TextLimits
from training.datasets import (
    REGISTRY,
    Corpus,
    CorpusFileMissingError,
    load_user_corpus,
    subsample_per_class,
)
from training.settings import TrainingSettings


@dataclass(frozen=True)
class CorpusSpec:
    """A registered corpus name or a CSV/JSONL path, and how to read and slice it."""

    dataset: str
    seed: int = 0
    """Seed of the per-class subsample (and, in training, of the splits)."""
    per_class: int | None = None
    corpus_is_public: bool = False
    text_column: str = "text"
    label_column: str = "label"
    limits: TextLimits = field(default_factory=TextLimits)


CORPUS_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
"""What a user corpus file's name ends with (a name without one may be a registered corpus)."""


def load_corpus(spec: CorpusSpec, settings: TrainingSettings) -> Corpus:
    """The corpus ``spec`` names, subsampled to ``per_class`` documents per class if set."""
    if spec.dataset in REGISTRY:
        corpus = REGISTRY[spec.dataset](settings.cache_dir, spec.limits)
    else:
        path = Path(spec.dataset)
        if not path.exists() and path.suffix.lower() in CORPUS_SUFFIXES:
            raise CorpusFileMissingError(f"no such corpus file: {path}")
        if not path.exists():
            raise InputError(
                f"unknown dataset {spec.dataset!r}: use one of {sorted(REGISTRY)} or a path "
                "to a CSV/JSONL file"
            )
        corpus = load_user_corpus(
            path, spec.text_column, spec.label_column, spec.corpus_is_public, spec.limits
        )
    if spec.per_class is not None:
        corpus = subsample_per_class(corpus, spec.per_class, spec.seed)
    return corpus
