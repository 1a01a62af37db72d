"""The sentence encoder G run by ONNX Runtime on the CPU, without torch.

The same length buckets as :class:`sentdp.encoders.SentenceEncoder`: every sentence is
tokenized alone (the model's own ``tokenizer.json``), padded to its bucket and encoded in a
batch of that bucket, so its embedding is a function of that sentence alone; the worker's
start-up check verifies it as for torch. Two model files are supported, both written at
training time by ``training.onnx_export``:

- ``onnx/model.onnx`` (backend ``onnx``): the float32 graph; with the pooling below, the
  same function as torch's up to float rounding;
- ``onnx/model_int8.onnx`` (backend ``onnx-int8``): weights and activations of the matrix
  products quantized to int8 with *static* scales calibrated on public text. Dynamic
  quantization (sentence-transformers' ``export_dynamic_quantized_onnx_model``) is not
  offered: it scales a batch's activations by the batch's own range, so a sentence's
  embedding moves with the other sentences of its batch (measured: up to 0.03), which the
  privacy argument forbids.

The graph ends at the transformer's token embeddings (output ``token_embeddings``) and the
mean pooling and normalization that follow run here, row by row in NumPy: ONNX Runtime's
``ReduceSum`` over the token axis sums in an order that depends on the number of rows in the
batch, so a graph that pools inside moved a sentence's embedding (by ~1e-7) with its batch
companions and needed fixed-shape batches, while the transformer itself gave bit-identical
rows for every row count tried (measured on an AVX-512 Xeon, 1 to 64 rows). A row pooled
here is computed from that row's tokens alone. Graphs exported before (output
``sentence_embedding``, pooling inside) still run as they are.

Threads (``threading``): by default (``rows``) each pass is cut into row pieces run
side by side, one thread each, on one session of a single intra-op thread. A row's embedding
comes from its row alone whatever the piece (the worker's start-up check covers it), and the
threads never wait for each other inside a run: ONNX Runtime's own split of each operator over
two threads (``operators``) made every operator wait for its slower thread, so a core taken
by the gateway for a moment stalled both (measured on 2 cores of an AMD EPYC, int8, BBC News:
1.03-1.32x the sentences/s of the encoder alone, more with another process busy;
docs/performance.md, "Threads over rows").

Serving an ONNX bundle imports neither torch nor sentence-transformers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp import encoder_layout
from sentdp.encoder_layout import Pooling, SentenceTokenizer, max_tokens_of, pooling_of
from sentdp.encoders import (
    ONNX_THREADINGS,
    OnnxThreading,
    bucket_of,
    bucket_passes,
    file_sha256,
    length_buckets,
)
from sentdp.errors import InputError

ONNX_FILES = {"onnx": "onnx/model.onnx", "onnx-int8": "onnx/model_int8.onnx"}
"""Where each ONNX backend's graph lives inside an encoder directory."""
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
UNPOOLED_OUTPUT = "token_embeddings"
"""The output of a graph that ends before pooling (pooled here by :func:`mean_pool`)."""
SENTENCE_OUTPUT = encoder_layout.SENTENCE_OUTPUT
"""The output of a graph that pools inside (exported before pooling moved out of it)."""
PIECES_PER_THREAD = 2
"""Row pieces per pass and thread in ``rows`` threading: more than one, so a thread slowed by
another process does less of the pass (measured at one BBC News document: 2 pieces per pass
on 2 threads 213 sentences/s, 4 pieces 237)."""


def mean_pool(
    tokens: npt.NDArray[np.float32], lengths: Sequence[int], normalize: bool
) -> npt.NDArray[np.float32]:
    """Each row's mean over its first ``lengths[i]`` token embeddings (its unpadded
    tokens), L2-normalized if asked: sentence-transformers' mean pooling and Normalize,
    computed for each row from that row's tokens alone, so no other row of the batch, nor
    how many there are, can change it."""
    rows, width = tokens.shape[0], tokens.shape[1]
    if len(lengths) != rows or any(not 0 <= length <= width for length in lengths):
        raise InputError(f"need a length in [0, {width}] for each of {rows} rows")
    out = np.empty((rows, tokens.shape[2]), dtype=np.float32)
    for row, length in enumerate(lengths):
        pooled = np.add.reduce(tokens[row, :length], axis=0, dtype=np.float32)
        pooled /= np.float32(max(length, 1))
        if normalize:
            norm = np.sqrt(np.add.reduce(pooled * pooled, dtype=np.float32))
            pooled /= max(norm, np.float32(1e-12))
        out[row] = pooled
    return out


class OnnxSentenceEncoder:
    """G as an ONNX Runtime session on the CPU, with the torch encoder's interface."""

    def __init__(
        self,
        model_dir: str | Path,
        backend: str = "onnx",
        batch_size: int = 64,
        fixed_batch: bool = False,
        threads: int = 2,
        spin_between_runs: bool = False,
        threading: OnnxThreading = "rows",
    ) -> None:
        import onnxruntime as ort

        if backend not in ONNX_FILES:
            raise InputError(f"unknown ONNX backend {backend!r}; one of {sorted(ONNX_FILES)}")
        if threading not in ONNX_THREADINGS:
            raise InputError(f"unknown ONNX threading {threading!r}; one of {ONNX_THREADINGS}")
        self.path = Path(model_dir)
        self.backend = backend
        self.model_file = self.path / ONNX_FILES[backend]
        if not self.model_file.is_file():
            raise InputError(
                f"{self.path} has no {ONNX_FILES[backend]}: the encoder was not exported "
                f"for the {backend} backend"
            )
        self.device = "cpu"
        self.batch_size = batch_size
        self.fixed_batch = fixed_batch
        self.threading = threading
        self.threads = threads
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="sentdp-onnx")
            if threading == "rows" and threads > 1
            else None
        )
        self.max_tokens = max_tokens_of(self.path)
        self._buckets = length_buckets(self.max_tokens)
        self._tokenizer = SentenceTokenizer(self.path, self.max_tokens)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads if threading == "operators" else 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        if not spin_between_runs:
            # The pool's threads spin while a run lasts (a run's operators follow each other
            # faster than sleeping threads wake) and sleep when it returns. By default they
            # go on spinning after it, a full core each, taking it from the gateway and the
            # ledger on the same machine (measured: 20 ms of CPU in the 20 ms after each run,
            # none with this entry; allow_spinning=0 instead ran 25% slower).
            options.add_session_config_entry("session.force_spinning_stop", "1")
        self._session = ort.InferenceSession(
            str(self.model_file), options, providers=["CPUExecutionProvider"]
        )
        self._inputs = [i.name for i in self._session.get_inputs()]
        unknown = set(self._inputs) - set(INPUT_NAMES)
        if unknown:
            raise InputError(f"the graph {self.model_file} asks for unknown inputs {unknown}")
        outputs = [o.name for o in self._session.get_outputs()]
        self.pooling: Pooling | None = None  # None: the graph pools inside
        if outputs == [UNPOOLED_OUTPUT]:
            self.pooling = pooling_of(self.path)
            if self.pooling is None:
                raise InputError(
                    f"the graph {self.model_file} ends at token embeddings, but {self.path} "
                    "does not describe a mean pooling sentdp can apply after it"
                )
            if "attention_mask" not in self._inputs:
                raise InputError(
                    f"the graph {self.model_file} ends at token embeddings but takes no "
                    "attention mask, so sentdp cannot tell its tokens from padding"
                )
        elif outputs != [SENTENCE_OUTPUT]:
            raise InputError(
                f"the graph {self.model_file} has outputs {outputs}; expected "
                f"[{UNPOOLED_OUTPUT!r}] or [{SENTENCE_OUTPUT!r}]"
            )
        self.dim = int(self._run(self._pad(self._tokenizer.ids(["probe"]), 8)).shape[1])

    def describe(self) -> dict[str, Any]:
        """What a model bundle records about G (the graph's digest pins the exact file)."""
        return {
            "name": self.path.name,
            "dim": self.dim,
            "max_tokens": self.max_tokens,
            "length_buckets": self._buckets,
            "backend": self.backend,
            "onnx_sha256": file_sha256(self.model_file),
            "pooling": self.pooling_record,
        }

    @property
    def pooling_record(self) -> str:
        """The pooling as a manifest records it: "graph" for a graph that pools inside."""
        return self.pooling or "graph"

    def _ids(self, sentences: Sequence[str]) -> list[list[int]]:
        return self._tokenizer.ids(sentences)

    def buckets_of(self, sentences: Sequence[str]) -> list[int]:
        """The padded length of each sentence: a function of that sentence alone."""
        return [bucket_of(len(ids), self._buckets) for ids in self._ids(sentences)]

    def _pad(self, rows: list[list[int]], length: int) -> dict[str, npt.NDArray[np.int64]]:
        ids, mask = self._tokenizer.pad(rows, length)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return {name: feeds[name] for name in self._inputs}

    @property
    def pools_outside(self) -> bool:
        """Whether the graph ends at token embeddings and sentdp pools them row by row."""
        return self.pooling is not None

    def _run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        output = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)
        if self.pooling is None:
            return output
        lengths = feeds["attention_mask"].sum(axis=1).tolist()  # _pad pads on the right
        return mean_pool(output, lengths, normalize=self.pooling == "mean+normalize")

    def warm_up(self) -> None:
        """Nothing to prepare: ONNX Runtime's session is ready once loaded."""

    def encode(self, sentences: Sequence[str]) -> npt.NDArray[np.float32]:
        """(n, dim) float32 embeddings, each computed as if its sentence were alone."""
        out = np.empty((len(sentences), self.dim), dtype=np.float32)
        if not sentences:
            return out
        filler = self._tokenizer.filler if self.fixed_batch else None
        passes = bucket_passes(self._ids(sentences), self._buckets, self.batch_size, filler)
        if self._pool is None:
            for indices, rows, length in passes:
                out[indices] = self._run(self._pad(rows, length))[: len(indices)]
            return out

        def piece(indices: list[int], rows: list[list[int]], length: int) -> None:
            out[indices] = self._run(self._pad(rows, length))[: len(indices)]

        runs = []
        cut = PIECES_PER_THREAD * self.threads
        for indices, rows, length in passes:
            # a fixed-shape pass stays whole: its shape is what the start-up check asked for
            size = len(rows) if filler is not None else math.ceil(len(rows) / cut)
            for at in range(0, len(rows), size):
                runs.append(
                    self._pool.submit(piece, indices[at : at + size], rows[at : at + size], length)
                )
        try:
            for run in runs:
                run.result()
        finally:
            for run in runs:  # after a failure, the pieces not started yet are not run
                run.cancel()
        return out
