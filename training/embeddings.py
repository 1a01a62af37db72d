"""Sentence embeddings of a corpus with G, computed once and cached on disk.

The cache key is a hash of the corpus's sentences, the encoder's files and the splitter, so a
different corpus slice, encoder or segmentation never reuses stale vectors.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sentdp.encoders import Encoder, encoder_files_sha256
from training.datasets import Corpus


@dataclass(frozen=True)
class CorpusEmbeddings:
    """All sentence embeddings of a corpus, documents stacked row-wise."""

    vectors: npt.NDArray[np.float32]
    offsets: npt.NDArray[np.int64]
    """Document i owns rows ``offsets[i]:offsets[i+1]``."""
    seconds: float
    """Time spent encoding (0 when read from the cache)."""
    from_cache: bool

    def document(self, i: int) -> npt.NDArray[np.float32]:
        return self.vectors[self.offsets[i] : self.offsets[i + 1]]

    def means(self, indices: list[int]) -> npt.NDArray[np.float64]:
        return np.stack([self.document(i).astype(np.float64).mean(axis=0) for i in indices])


def encoder_fingerprint(encoder: Encoder) -> str:
    digest = hashlib.sha256(encoder_files_sha256(encoder.path).encode())
    described = {k: v for k, v in encoder.describe().items() if k != "name"}
    digest.update(json.dumps(described, sort_keys=True).encode())
    return digest.hexdigest()


def cache_key(corpus: Corpus, encoder: Encoder, splitter: dict[str, str]) -> str:
    digest = hashlib.sha256()
    digest.update(encoder_fingerprint(encoder).encode())
    digest.update(json.dumps(splitter, sort_keys=True).encode())
    for document in corpus.documents:
        digest.update(json.dumps(document.sentences).encode())
    return digest.hexdigest()[:32]


def embed_corpus(
    corpus: Corpus,
    encoder: Encoder,
    cache_dir: Path,
    splitter: dict[str, str],
    show_progress: bool = True,
) -> CorpusEmbeddings:
    """Embeddings of every sentence of ``corpus``, from the cache when present."""
    key = cache_key(corpus, encoder, splitter)
    path = cache_dir / "embeddings" / f"{corpus.name}-{key}.npz"
    if path.is_file():
        with np.load(path) as cached:
            return CorpusEmbeddings(cached["vectors"], cached["offsets"], 0.0, True)
    sentences = [s for doc in corpus.documents for s in doc.sentences]
    offsets = np.concatenate(([0], np.cumsum([len(d.sentences) for d in corpus.documents])))
    vectors = np.empty((len(sentences), encoder.dim), dtype=np.float32)
    chunk = max(encoder.batch_size * 8, 256)
    start_time = time.perf_counter()
    with Progress(
        TextColumn(f"encoding {corpus.name}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} sentences"),
        TextColumn("{task.fields[rate]:.0f} sentences/s"),
        TimeElapsedColumn(),
        disable=not show_progress,
    ) as progress:
        task = progress.add_task("encode", total=len(sentences), rate=0.0)
        for start in range(0, len(sentences), chunk):
            block = sentences[start : start + chunk]
            vectors[start : start + len(block)] = encoder.encode(block)
            done = start + len(block)
            rate = done / max(time.perf_counter() - start_time, 1e-9)
            progress.update(task, completed=done, rate=rate)
    seconds = time.perf_counter() - start_time
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, vectors=vectors, offsets=offsets)
    os.replace(partial, path)
    return CorpusEmbeddings(vectors, offsets.astype(np.int64), seconds, False)
