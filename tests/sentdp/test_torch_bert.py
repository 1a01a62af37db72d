"""sentdp's own torch forward pass gives sentence-transformers' embeddings bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sentdp import torch_bert
from sentdp.encoders import INVARIANCE_PROBES, SentenceEncoder, default_encoder_path
from sentdp.errors import InputError

EDGE_TEXTS = [
    "",
    "   ",
    "  leading and trailing spaces  ",
    "Tabs\tand\u2028line separators\u00a0here.",
    "\u4e2d\u6587\u53e5\u5b50\uff0c\u8fd8\u6709\u6807\u70b9\u3002",
    "Emoji 😀 and [PAD] [SEP] [CLS] written as text.",
    "x" * 3000,
    " ".join(["token"] * 400),  # truncated to 256 tokens
]


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """Real BBC News sentences of every length the corpus has, plus edge cases."""
    from sentdp.text import TextLimits
    from training.datasets import REGISTRY
    from training.settings import load_settings

    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    real = [s for document in corpus.documents[:60] for s in document.sentences]
    return [*real[:500], *INVARIANCE_PROBES, *EDGE_TEXTS]


@pytest.fixture(scope="module")
def in_stack() -> SentenceEncoder:
    return SentenceEncoder(default_encoder_path(), "cpu", plain_torch=False)


def test_the_default_encoder_runs_in_sentdps_forward_pass(encoder) -> None:
    assert torch_bert.refusal(default_encoder_path()) is None
    assert encoder._bert is not None


def test_embeddings_equal_sentence_transformers_bit_for_bit(encoder, in_stack, sentences) -> None:
    ours, theirs = encoder.encode(sentences), in_stack.encode(sentences)
    assert ours.shape == theirs.shape == (len(sentences), 384)
    assert len(set(encoder.buckets_of(sentences))) >= 7  # 8 to 64 tokens, and 256
    np.testing.assert_array_equal(ours, theirs)
    # Token ids and buckets as sentence-transformers' tokenizer makes them.
    assert encoder._ids(sentences) == in_stack._ids(sentences)


def test_fixed_batches_equal_sentence_transformers_bit_for_bit(sentences) -> None:
    ours = SentenceEncoder(default_encoder_path(), "cpu", batch_size=8, fixed_batch=True)
    theirs = SentenceEncoder(
        default_encoder_path(), "cpu", batch_size=8, fixed_batch=True, plain_torch=False
    )
    np.testing.assert_array_equal(ours.encode(sentences[:120]), theirs.encode(sentences[:120]))


def test_rows_without_padding_equal_sentence_transformers(encoder, in_stack, sentences) -> None:
    """transformers gives SDPA no mask when no row of a batch has padding; sentdp always gives
    one: the same bits alone, and beside a padded row (where transformers masks too). Each is
    compared with sentence-transformers at the same row count: on some CPUs (AVX-512) the
    kernels vary with the row count, which is what the worker's start-up check is for."""
    rows = encoder._ids(sentences)
    full = [i for i, row in enumerate(rows) if len(row) in encoder._buckets][:6]
    assert full, "no sentence fills its bucket exactly"
    short = next(i for i, row in enumerate(rows) if len(row) < 8)
    for index in full:
        length = len(rows[index])
        padding = {"text": {"padding": "max_length", "max_length": length}}
        for batch in ([index], [index, short]):
            ours = encoder.run_padded([rows[i] for i in batch], length)[0]
            reference = in_stack.stack.encode(
                [sentences[i] for i in batch], convert_to_numpy=True, processing_kwargs=padding
            )[0]
            np.testing.assert_array_equal(ours, reference)


def test_a_wrong_step_would_show(encoder, in_stack, sentences, monkeypatch) -> None:
    """Guard for the tests above: a forward pass that differs in one operation (tanh-GELU
    instead of the exact one) no longer matches."""
    from torch.nn import functional

    exact = functional.gelu
    monkeypatch.setattr(functional, "gelu", lambda x: exact(x, approximate="tanh"))
    assert not np.array_equal(encoder.encode(sentences[:20]), in_stack.encode(sentences[:20]))


def _copy(tmp_path: Path) -> Path:
    """The default encoder's directory, its weights linked, its configs copied to edit."""

    def link_weights(source: str, target: str) -> None:
        if source.endswith(".safetensors"):
            os.symlink(source, target)
        else:
            shutil.copy(source, target)

    target = tmp_path / "encoder"
    shutil.copytree(default_encoder_path(), target, copy_function=link_weights)
    return target


@pytest.mark.parametrize(
    ("file", "key", "value", "reason"),
    [
        ("config.json", "hidden_act", "relu", "hidden_act 'relu'"),
        ("config.json", "model_type", "roberta", "model_type 'roberta'"),
        ("config.json", "position_embedding_type", "relative_key", "position_embedding_type"),
        ("sentence_bert_config.json", "do_lower_case", True, "more than a truncation length"),
        ("1_Pooling/config.json", "pooling_mode_cls_token", True, "not a transformer with mean"),
    ],
)
def test_other_encoders_run_in_sentence_transformers(tmp_path, file, key, value, reason) -> None:
    directory = _copy(tmp_path)
    config = json.loads((directory / file).read_text())
    config[key] = value
    if key == "pooling_mode_cls_token":
        config["pooling_mode_mean_tokens"] = False
    (directory / file).write_text(json.dumps(config))
    assert reason in (torch_bert.refusal(directory) or "")
    with pytest.raises(InputError, match="cannot run the encoder"):
        torch_bert.TorchBert(directory)
    if key in ("hidden_act", "do_lower_case"):  # sentence-transformers can load these
        fallback = SentenceEncoder(directory, "cpu")
        assert fallback._bert is None
        assert fallback.encode(["It still encodes."]).shape == (1, 384)


def test_missing_weights_are_refused(tmp_path) -> None:
    directory = _copy(tmp_path)
    (directory / torch_bert.WEIGHTS_FILE).unlink()
    assert "model.safetensors" in (torch_bert.refusal(directory) or "")


@pytest.mark.parametrize(
    ("file", "key", "value"),
    [
        ("tokenizer_config.json", "do_lower_case", False),  # transformers rebuilds the normalizer
        ("config.json", "torch_dtype", "float16"),  # transformers loads the weights in float16
        ("config_sentence_transformers.json", "prompts", {"query": "query: "}),
    ],
)
def test_settings_this_forward_pass_does_not_read_send_the_encoder_to_sentence_transformers(
    tmp_path, encoder, file, key, value
) -> None:
    """Only configs verified against sentence-transformers run here: these edits pass every
    structural check but change what sentence-transformers computes."""
    directory = _copy(tmp_path)
    config = json.loads((directory / file).read_text())
    config[key] = value
    if key == "prompts":
        config["default_prompt_name"] = "query"
    (directory / file).write_text(json.dumps(config))
    assert "not a layout verified" in (torch_bert.refusal(directory) or "")
    fallback = SentenceEncoder(directory, "cpu")
    assert fallback._bert is None
    text = ["Hello World, said Ann."]
    moved = np.abs(fallback.encode(text) - encoder.encode(text)).max()
    assert moved > 1e-5  # running these here would have served other embeddings


def test_weights_of_another_shape_are_refused(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    directory = _copy(tmp_path)
    weights = load_file(str(directory / torch_bert.WEIGHTS_FILE))
    name = "encoder.layer.3.intermediate.dense.bias"
    weights[name] = weights[name][:-1].clone()
    (directory / torch_bert.WEIGHTS_FILE).unlink()
    save_file(weights, str(directory / torch_bert.WEIGHTS_FILE))
    assert torch_bert.refusal(directory) is None  # the weights are checked on loading
    with pytest.raises(InputError, match=f"{name} of shape"):
        torch_bert.TorchBert(directory)


def test_encoding_imports_neither_transformers_nor_sentence_transformers() -> None:
    code = (
        "import sys\n"
        "from sentdp.encoders import SentenceEncoder\n"
        "SentenceEncoder(device='cpu').encode(['A sentence.'])\n"
        "print(','.join(m for m in ('transformers', 'sentence_transformers', 'scipy')"
        " if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
