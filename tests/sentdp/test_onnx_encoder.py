"""The ONNX Runtime encoder backends: the same function as torch (float32) or close to it
(static int8), the bit-identity rule kept, the graph pinned by the bundle, and a bundle
refusing to serve with another backend than the one it was trained with."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from sentdp.bundle import Bundle
from sentdp.encoders import (
    INVARIANCE_PROBES,
    TokenCounter,
    backend_of,
    batch_invariance_violations,
    default_encoder_path,
    encoder_files_sha256,
    open_encoder,
)
from sentdp.errors import InputError
from sentdp.onnx_encoder import ONNX_FILES, OnnxSentenceEncoder
from tests.service.fakes import tiny_bundle

CALIBRATION = [
    "The central bank left interest rates unchanged on Thursday.",
    "Chelsea beat Arsenal two goals to one in a tense derby.",
    "The new phone has a faster chip and a brighter screen.",
    "Ministers will vote on the bill next week, officials said.",
    "Her latest film opened to strong reviews at the festival.",
] * 8


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from training.onnx_export import exported_encoder

    cache = tmp_path_factory.mktemp("onnx-cache")
    source = default_encoder_path()
    return {
        "onnx": exported_encoder(source, "onnx", cache),
        "onnx-int8": exported_encoder(source, "onnx-int8", cache, CALIBRATION),
    }


def test_float32_graph_is_torchs_function_and_tokenizes_alike(encoder, exported) -> None:
    onnx = open_encoder(exported["onnx"], "onnx", batch_size=8)
    assert isinstance(onnx, OnnxSentenceEncoder)
    assert (onnx.dim, onnx.max_tokens) == (encoder.dim, encoder.max_tokens)
    long = " ".join(["word"] * 400)  # truncated at the encoder's max length by both
    probes = [*INVARIANCE_PROBES, long]
    assert onnx.buckets_of(probes) == encoder.buckets_of(probes)
    difference = np.abs(onnx.encode(probes) - encoder.encode(probes)).max()
    assert difference < 1e-5


def test_int8_stays_close_to_torch(encoder, exported) -> None:
    int8 = open_encoder(exported["onnx-int8"], "onnx-int8", batch_size=8)
    reference = encoder.encode(list(INVARIANCE_PROBES))
    quantized = int8.encode(list(INVARIANCE_PROBES))
    assert not np.array_equal(quantized, reference)  # it is quantized
    cosines = (quantized * reference).sum(axis=1)
    assert cosines.min() > 0.97


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_fixed_batches_keep_a_sentence_independent_of_its_batch(exported, backend) -> None:
    fixed = open_encoder(exported[backend], backend, batch_size=4, fixed_batch=True)
    probes = INVARIANCE_PROBES[:4]
    assert batch_invariance_violations(fixed, probes, batch_sizes=(2, 5)) == []
    alone = fixed.encode([probes[1]])[0]
    crowd = [probes[0], probes[2], probes[1], probes[3], probes[1], probes[0]]
    np.testing.assert_array_equal(fixed.encode(crowd)[2], alone)


def test_the_export_is_made_once_and_reused(exported) -> None:
    from training.onnx_export import exported_encoder

    cache = exported["onnx"].parent.parent
    before = (exported["onnx"] / ONNX_FILES["onnx"]).stat().st_mtime_ns
    again = exported_encoder(default_encoder_path(), "onnx", cache)
    assert again == exported["onnx"]
    assert (again / ONNX_FILES["onnx"]).stat().st_mtime_ns == before
    assert not list(cache.glob("encoders/.partial-*"))
    assert not (exported["onnx-int8"] / ONNX_FILES["onnx"]).exists()  # only the int8 graph


def test_backends_refuse_what_they_cannot_do(exported) -> None:
    with pytest.raises(InputError, match="runs on the CPU"):
        open_encoder(exported["onnx"], "onnx", device="cuda")
    with pytest.raises(InputError, match="unknown encoder backend"):
        open_encoder(exported["onnx"], "tensorrt")
    with pytest.raises(InputError, match="not exported for the onnx-int8 backend"):
        open_encoder(exported["onnx"], "onnx-int8")


def _onnx_bundle(exported: dict[str, Path], backend: str, tmp_path: Path) -> Path:
    encoder = open_encoder(exported[backend], backend)
    base = tiny_bundle(encoder_dir=exported[backend])
    described = encoder.describe() | {"files_sha256": encoder_files_sha256(encoder.path)}
    manifest = base.manifest.model_copy(update={"encoder": described})
    directory = tmp_path / "bundle"
    dataclasses.replace(base, manifest=manifest).save(directory)
    return directory


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_a_bundle_round_trips_its_backend_and_refuses_another(exported, backend, tmp_path) -> None:
    directory = _onnx_bundle(exported, backend, tmp_path)
    bundle = Bundle.load(directory)
    assert bundle.encoder_backend == backend
    bundle.check_encoder()
    bundle.check_encoder(backend)
    for other in {"torch", "onnx", "onnx-int8"} - {backend}:
        with pytest.raises(InputError, match=f"trained with the {backend} encoder backend"):
            bundle.check_encoder(other)
    served = open_encoder(bundle.encoder_dir, bundle.encoder_backend, batch_size=8)
    original = open_encoder(exported[backend], backend, batch_size=8)
    np.testing.assert_array_equal(
        served.encode(list(INVARIANCE_PROBES)), original.encode(list(INVARIANCE_PROBES))
    )


def test_a_bundle_refuses_a_swapped_graph(exported, tmp_path) -> None:
    directory = _onnx_bundle(exported, "onnx", tmp_path)
    graph = directory / "encoder" / ONNX_FILES["onnx"]
    graph.unlink()
    shutil.copy(exported["onnx-int8"] / ONNX_FILES["onnx-int8"], graph)
    with pytest.raises(InputError, match="not the ones it was trained with"):
        Bundle.load(directory).check_encoder()


def test_a_bundle_refuses_an_edited_tokenizer_or_config(exported, tmp_path) -> None:
    directory = _onnx_bundle(exported, "onnx-int8", tmp_path)
    Bundle.load(directory).check_encoder()
    config = directory / "encoder" / "sentence_bert_config.json"
    config.write_text(config.read_text().replace("256", "128"))
    with pytest.raises(InputError, match="not the ones it was trained with"):
        Bundle.load(directory).check_encoder()


EDGE_TEXTS = [
    "",
    "   ",
    "Tabs\tand\u2028line separators\u00a0here.",
    "\u4e2d\u6587\u53e5\u5b50\uff0c\u8fd8\u6709\u6807\u70b9\u3002",
    "x" * 3000,
    "Emoji 😀 and [PAD] [SEP] [CLS] written as text.",
    " ".join(["token"] * 400),
]


def test_token_ids_are_torchs_and_the_gateways(encoder, exported) -> None:
    """The worker's ids (tokenizers) are the HF tokenizer's, truncation included, and the
    gateway's TokenCounter charges the same buckets."""
    onnx = open_encoder(exported["onnx"], "onnx")
    assert isinstance(onnx, OnnxSentenceEncoder)
    hf = encoder._model.tokenizer(EDGE_TEXTS, truncation=True, max_length=encoder.max_tokens)
    assert onnx._ids(EDGE_TEXTS) == hf["input_ids"]
    counter = TokenCounter(exported["onnx"], onnx.max_tokens)
    assert counter.padded_tokens(EDGE_TEXTS) == onnx.buckets_of(EDGE_TEXTS)


def test_bundles_before_backends_ran_torch(tmp_path) -> None:
    (tmp_path / "encoder").mkdir()
    old = tiny_bundle(encoder_dir=tmp_path / "encoder")
    assert backend_of(old.manifest.encoder) == "torch"
    old.check_encoder("torch")
    with pytest.raises(InputError, match="trained with the torch encoder backend"):
        old.check_encoder("onnx")


def test_an_evaluation_never_mixes_backends(tmp_path) -> None:
    from evaluation.experiment import _check_same_corpus

    torch_bundle = tiny_bundle(encoder_dir=tmp_path)
    onnx_manifest = torch_bundle.manifest.model_copy(update={"encoder": {"backend": "onnx"}})
    onnx_bundle = dataclasses.replace(torch_bundle, manifest=onnx_manifest)
    _check_same_corpus([torch_bundle, torch_bundle])
    with pytest.raises(ValueError, match="must share an encoder"):
        _check_same_corpus([torch_bundle, onnx_bundle])
