"""What a sentence-transformers directory says, read without sentence-transformers.

Its module stack's pooling, its truncation length and its tokenizer (``tokenizer.json``, run
by the ``tokenizers`` library, each sentence tokenized alone). The encoders that run G
without sentence-transformers (:mod:`sentdp.torch_bert` for torch, :mod:`sentdp.onnx_encoder`
for ONNX Runtime) and the gateway's token counter read the directory through this module, so
they agree with each other and with sentence-transformers (tested).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from sentdp.errors import InputError

DEFAULT_MAX_TOKENS = 512
"""The truncation length when a directory names none (the largest length bucket)."""

Pooling = Literal["mean", "mean+normalize"]
"""A pooling sentdp applies after a transformer that ends at token embeddings."""

SENTENCE_OUTPUT = "sentence_embedding"
"""The feature sentence-transformers' Pooling writes and its Normalize reads."""

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
    embedding, where sentdp can do it outside the transformer: "mean" (mean over the tokens)
    or "mean+normalize" (then L2 normalization); None for any other module stack, a pooling
    sentdp does not implement, or files it cannot read. The configs are read as
    sentence-transformers 6 reads them: ``pooling_mode`` wins over the older
    ``pooling_mode_*`` flags, and no flag set means mean."""
    stack = module_stack(model_dir)
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


def module_stack(
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


def max_tokens_of(model_dir: Path) -> int:
    """The encoder's truncation length, as sentence-transformers reads it."""
    config = model_dir / "sentence_bert_config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    return DEFAULT_MAX_TOKENS


class SentenceTokenizer:
    """The directory's ``tokenizer.json``: each sentence tokenized alone, truncated to
    ``max_tokens`` (special tokens included), and rows padded on the right."""

    def __init__(self, model_dir: Path, max_tokens: int) -> None:
        from tokenizers import Tokenizer

        file = model_dir / "tokenizer.json"
        if not file.is_file():
            raise InputError(f"{model_dir} has no tokenizer.json")
        self._tokenizer = Tokenizer.from_file(str(file))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_tokens)
        self._model_dir = model_dir
        self.filler = self._tokenizer.encode(".").ids
        """A public sentence's ids, for the rows that fill a fixed-shape batch."""

    def ids(self, sentences: Sequence[str]) -> list[list[int]]:
        """Each sentence's token ids, computed for that sentence alone."""
        return [e.ids for e in self._tokenizer.encode_batch(list(sentences))]

    @functools.cached_property
    def pad_id(self) -> int:
        """The padding token's id, read when first padding: counting tokens needs none."""
        return _pad_id(self._model_dir, self._tokenizer)

    def pad(
        self, rows: list[list[int]], length: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Token ids and attention mask, (len(rows), length), padded on the right."""
        ids = np.full((len(rows), length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return ids, mask


def _pad_id(model_dir: Path, tokenizer: Any) -> int:
    config = model_dir / "tokenizer_config.json"
    token = json.loads(config.read_text()).get("pad_token") if config.is_file() else None
    if isinstance(token, dict):
        token = token.get("content")
    pad = tokenizer.token_to_id(token) if token else None
    if pad is None:
        raise InputError(f"cannot find the padding token of the tokenizer in {model_dir}")
    return int(pad)
