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

Serving an ONNX bundle imports neither torch nor sentence-transformers.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from sentdp.encoders import LENGTH_BUCKETS, bucket_of, file_sha256, length_buckets
from sentdp.errors import InputError

ONNX_FILES = {"onnx": "onnx/model.onnx", "onnx-int8": "onnx/model_int8.onnx"}
"""Where each ONNX backend's graph lives inside an encoder directory."""
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
UNPOOLED_OUTPUT = "token_embeddings"
"""The output of a graph that ends before pooling (pooled here by :func:`mean_pool`)."""
SENTENCE_OUTPUT = "sentence_embedding"
"""The output of a graph that pools inside (exported before pooling moved out of it)."""


Pooling = Literal["mean", "mean+normalize"]
"""A pooling sentdp applies after a graph that ends at token embeddings."""

LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""sentence-transformers' older boolean pooling keys and the mode each names."""


def pooling_of(model_dir: Path) -> Pooling | None:
    """How a sentence-transformers directory turns token embeddings into a sentence
    embedding, where sentdp can do it outside the graph: "mean" (mean over the tokens) or
    "mean+normalize" (then L2 normalization); None for any other module stack, a pooling
    sentdp does not implement, or files it cannot read (that graph keeps its pooling
    inside). The configs are read as sentence-transformers 6 reads them: ``pooling_mode``
    wins over the older ``pooling_mode_*`` flags, and no flag set means mean."""
    stack = _module_stack(model_dir)
    if stack is None:
        return None
    modules, pooling, normalize = stack
    if "pooling_mode" in pooling:
        mode = pooling["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else mode if isinstance(mode, list) else []
    else:
        modes = [name for key, name in LEGACY_POOLING_KEYS.items() if pooling.get(key)] or ["mean"]
    if modes != ["mean"] or pooling.get("include_prompt", True) is not True:
        return None
    if len(modules) == 2:
        return "mean"
    reads = normalize.get("module_input_name", SENTENCE_OUTPUT)
    writes = normalize.get("module_output_name") or reads
    return "mean+normalize" if reads == writes == SENTENCE_OUTPUT else None


def _module_stack(
    model_dir: Path,
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]] | None:
    """The modules of a Transformer-Pooling[-Normalize] stack, its pooling config and its
    Normalize config ({} where there is none); None for any other stack or unreadable files."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
        kinds = [str(module["type"]).rsplit(".", 1)[-1] for module in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return None
        folders = [_inside(model_dir, str(module["path"])) for module in modules[1:]]
        if None in folders:
            return None
        configs = [_config(folder) for folder in folders if folder is not None]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(isinstance(config, dict) for config in configs):
        return None
    return modules, configs[0], configs[1] if len(configs) == 2 else {}


def _inside(model_dir: Path, relative: str) -> Path | None:
    """``model_dir / relative`` when ``relative`` stays inside the directory, else None."""
    if Path(relative).is_absolute() or ".." in Path(relative).parts:
        return None
    return model_dir / relative


def _config(folder: Path) -> Any:
    """A module folder's config.json ({} where the module has none)."""
    file = folder / "config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


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
            "pooling": self.pooling_record,
        }

    @property
    def pooling_record(self) -> str:
        """The pooling as a manifest records it: "graph" for a graph that pools inside."""
        return self.pooling or "graph"

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
