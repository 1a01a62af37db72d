"""The sentence encoder G run by ONNX Runtime on the CPU, without torch.

The same length buckets as :class:`sentdp.encoders.SentenceEncoder`: every sentence is
tokenized alone (the model's own ``tokenizer.json``), padded to its bucket and encoded in a
batch of that bucket, so its embedding is a function of that sentence alone; the worker's
start-up check verifies it as for torch. Two model files are supported, both written at
training time by ``training.onnx_export``:

- ``onnx/model.onnx`` (backend ``onnx``): the float32 graph, the same function as torch's
  up to float rounding;
- ``onnx/model_int8.onnx`` (backend ``onnx-int8``): weights and activations of the matrix
  products quantized to int8 with *static* scales calibrated on public text. Dynamic
  quantization (sentence-transformers' ``export_dynamic_quantized_onnx_model``) is not
  offered: it scales a batch's activations by the batch's own range, so a sentence's
  embedding moves with the other sentences of its batch (measured: up to 0.03), which the
  privacy argument forbids.

Serving an ONNX bundle imports neither torch nor sentence-transformers.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp.encoders import LENGTH_BUCKETS, bucket_of, file_sha256, length_buckets
from sentdp.errors import InputError

ONNX_FILES = {"onnx": "onnx/model.onnx", "onnx-int8": "onnx/model_int8.onnx"}
"""Where each ONNX backend's graph lives inside an encoder directory."""
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def max_tokens_of(model_dir: Path) -> int:
    """The encoder's truncation length, as sentence-transformers reads it."""
    config = model_dir / "sentence_bert_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    return LENGTH_BUCKETS[-1]


class OnnxSentenceEncoder:
    """G as an ONNX Runtime session on the CPU, with the torch encoder's interface."""

    def __init__(
        self,
        model_dir: str | Path,
        backend: str = "onnx",
        batch_size: int = 64,
        fixed_batch: bool = False,
        threads: int = 2,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if backend not in ONNX_FILES:
            raise InputError(f"unknown ONNX backend {backend!r}; one of {sorted(ONNX_FILES)}")
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
        self.max_tokens = max_tokens_of(self.path)
        self._buckets = length_buckets(self.max_tokens)
        self._tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(self.max_tokens)
        self._pad_id = _pad_id(self.path, self._tokenizer)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        self._session = ort.InferenceSession(
            str(self.model_file), options, providers=["CPUExecutionProvider"]
        )
        self._inputs = [i.name for i in self._session.get_inputs()]
        unknown = set(self._inputs) - set(INPUT_NAMES)
        if unknown:
            raise InputError(f"the graph {self.model_file} asks for unknown inputs {unknown}")
        self._filler = self._tokenizer.encode(".").ids  # public padding rows, as torch's
        self.dim = int(self._run(self._pad([self._tokenizer.encode("probe").ids], 8)).shape[1])

    def describe(self) -> dict[str, Any]:
        """What a model bundle records about G (the graph's digest pins the exact file)."""
        return {
            "name": self.path.name,
            "dim": self.dim,
            "max_tokens": self.max_tokens,
            "length_buckets": self._buckets,
            "backend": self.backend,
            "onnx_sha256": file_sha256(self.model_file),
        }

    def _ids(self, sentences: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tokenizer.encode_batch(list(sentences))]

    def buckets_of(self, sentences: Sequence[str]) -> list[int]:
        """The padded length of each sentence: a function of that sentence alone."""
        return [bucket_of(len(ids), self._buckets) for ids in self._ids(sentences)]

    def _pad(self, rows: list[list[int]], length: int) -> dict[str, npt.NDArray[np.int64]]:
        ids = np.full((len(rows), length), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return {name: feeds[name] for name in self._inputs}

    def _run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        return np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)

    def encode(self, sentences: Sequence[str]) -> npt.NDArray[np.float32]:
        """(n, dim) float32 embeddings, each computed as if its sentence were alone."""
        out = np.empty((len(sentences), self.dim), dtype=np.float32)
        if not sentences:
            return out
        groups: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
        for index, ids in enumerate(self._ids(sentences)):
            groups[bucket_of(len(ids), self._buckets)].append((index, ids))
        for bucket, members in sorted(groups.items()):
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                rows = [ids for _, ids in chunk]
                if self.fixed_batch:  # one input shape per bucket
                    rows += [self._filler] * (self.batch_size - len(rows))
                encoded = self._run(self._pad(rows, bucket))
                out[[index for index, _ in chunk]] = encoded[: len(chunk)]
        return out


def _pad_id(model_dir: Path, tokenizer: Any) -> int:
    config = model_dir / "tokenizer_config.json"
    token = json.loads(config.read_text()).get("pad_token") if config.is_file() else None
    if isinstance(token, dict):
        token = token.get("content")
    pad = tokenizer.token_to_id(token) if token else None
    if pad is None:
        raise InputError(f"cannot find the padding token of the tokenizer in {model_dir}")
    return int(pad)
