"""The ONNX Runtime encoder backends: the same function as torch (float32) or close to it
(static int8), the bit-identity rule kept, the graph pinned by the bundle, and a bundle
refusing to serve with another backend than the one it was trained with."""

from __future__ import annotations

import dataclasses
import resource
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from sentdp import onnx_encoder
from sentdp.bundle import Bundle
from sentdp.encoders import (
    INVARIANCE_PROBES,
    SentenceEncoder,
    TokenCounter,
    backend_of,
    batch_invariance_violations,
    default_encoder_path,
    encoder_files_sha256,
    fixed_batch_violations,
    open_encoder,
)
from sentdp.errors import InputError
from sentdp.onnx_encoder import ONNX_FILES, SENTENCE_OUTPUT, UNPOOLED_OUTPUT, OnnxSentenceEncoder
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
    assert fixed_batch_violations(fixed, INVARIANCE_PROBES) == []
    alone = fixed.encode([probes[1]])[0]
    crowd = [probes[0], probes[2], probes[1], probes[3], probes[1], probes[0]]
    np.testing.assert_array_equal(fixed.encode(crowd)[2], alone)


def _cpu_seconds() -> float:
    """CPU time of this process, all threads together."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize(
    ("threading", "spin"), [("operators", False), ("operators", True), ("rows", True)]
)
def test_the_threads_rest_between_runs_unless_asked_to_spin(exported, threading, spin) -> None:
    """By default the pool's threads stop when a run returns, so an idle worker takes no
    core from the gateway; ONNX Runtime's own default (``spin``) burns one for a while when
    its threads split operators. Row pieces run on one thread each: nothing spins."""
    encoder = open_encoder(
        exported["onnx-int8"],
        "onnx-int8",
        batch_size=8,
        threads=2,
        spin_between_runs=spin,
        onnx_threading=threading,
    )
    encoder.encode(list(CALIBRATION[:8]))
    before = _cpu_seconds()
    time.sleep(0.1)
    idle = _cpu_seconds() - before
    if spin and threading == "operators":
        assert idle > 0.01  # the control: ONNX Runtime's default spins (about 28 ms here)
    else:
        assert idle < 0.01  # any other thread of the test process must be idle too


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_row_pieces_keep_every_sentence_bit_identical_to_it_alone(exported, backend) -> None:
    """Each pass is cut into row pieces of every size from 1 to 8 rows here, run side by side
    on two threads: no piece, neighbour or thread may move a probe's embedding, and the rows
    come back in their sentences' order."""
    probes = list(INVARIANCE_PROBES[:6])
    rows = open_encoder(exported[backend], backend, batch_size=32, threads=2)
    assert rows.threading == "rows"
    assert batch_invariance_violations(rows, probes, batch_sizes=(2, 5, 17, 32)) == []
    single = open_encoder(exported[backend], backend, batch_size=32, threads=1)
    crowd = [*CALIBRATION, *probes]
    np.testing.assert_array_equal(rows.encode(crowd), single.encode(crowd))


def test_row_pieces_run_on_the_pool_s_threads_and_a_failure_is_the_caller_s(
    exported, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    encoder = open_encoder(exported["onnx-int8"], "onnx-int8", batch_size=16, threads=2)
    assert isinstance(encoder, OnnxSentenceEncoder)
    ran: list[tuple[str, int]] = []
    run = encoder._run

    def recorded(feeds):  # type: ignore[no-untyped-def]
        ran.append((threading.current_thread().name, len(feeds["input_ids"])))
        time.sleep(0.01)  # long enough for the second thread to take a piece
        return run(feeds)

    monkeypatch.setattr(encoder, "_run", recorded)
    encoder.encode([CALIBRATION[1]] * 16)  # one bucket: one pass of 16 rows
    assert sorted(rows for _, rows in ran) == [4, 4, 4, 4]  # 2 pieces per thread
    assert {name.split("_")[0] for name, _ in ran} == {"sentdp-onnx"}
    assert len({name for name, _ in ran}) == 2

    def failing(feeds):  # type: ignore[no-untyped-def]
        raise RuntimeError("the graph failed")

    monkeypatch.setattr(encoder, "_run", failing)
    with pytest.raises(RuntimeError, match="the graph failed"):
        encoder.encode(list(CALIBRATION[:16]))
    monkeypatch.setattr(encoder, "_run", run)
    assert encoder.encode(list(CALIBRATION[:3])).shape == (3, encoder.dim)


def test_an_unknown_threading_is_refused(exported) -> None:
    with pytest.raises(InputError, match="unknown ONNX threading"):
        open_encoder(exported["onnx"], "onnx", onnx_threading="columns")


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
    hf = encoder.stack.tokenizer(EDGE_TEXTS, truncation=True, max_length=encoder.max_tokens)
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
    # which library ran torch's linear layers in training does not matter: this run encodes
    # with its own SENTDP_CPU_LINEAR
    encoder = dict(torch_bundle.manifest.encoder) | {"cpu_linear": "onednn"}
    onednn_manifest = torch_bundle.manifest.model_copy(update={"encoder": encoder})
    _check_same_corpus([torch_bundle, dataclasses.replace(torch_bundle, manifest=onednn_manifest)])


def test_exported_graphs_end_at_token_embeddings_and_pool_outside(exported) -> None:
    import onnx

    for backend, directory in exported.items():
        graph = onnx.load(str(directory / ONNX_FILES[backend]), load_external_data=False)
        assert [o.name for o in graph.graph.output] == [UNPOOLED_OUTPUT]
        assert "ReduceSum" not in {node.op_type for node in graph.graph.node}
        encoder = open_encoder(directory, backend, batch_size=8)
        assert isinstance(encoder, OnnxSentenceEncoder)
        assert encoder.pools_outside
        norms = np.linalg.norm(encoder.encode(list(INVARIANCE_PROBES)), axis=1)
        np.testing.assert_allclose(norms, 1.0, atol=1e-6)  # the stack's Normalize, applied


def test_mean_pool_reads_only_its_own_rows_tokens() -> None:
    rng = np.random.default_rng(7)
    tokens = rng.standard_normal((6, 16, 5)).astype(np.float32)
    lengths = [16, 3, 1, 9, 16, 2]
    together = onnx_encoder.mean_pool(tokens, lengths, normalize=True)
    for row, length in enumerate(lengths):
        garbage = rng.standard_normal((4, 16, 5)).astype(np.float32) * 1e6
        garbage[2] = tokens[row]
        garbage[2, length:] = 1e9  # padding positions are never read
        alone = onnx_encoder.mean_pool(tokens[row : row + 1], [length], normalize=True)[0]
        crowd = onnx_encoder.mean_pool(garbage, [16, 16, length, 16], normalize=True)[2]
        np.testing.assert_array_equal(together[row], alone)
        np.testing.assert_array_equal(crowd, alone)
        expected = tokens[row, :length].astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(alone, expected / np.linalg.norm(expected), rtol=1e-5)
    unnormalized = onnx_encoder.mean_pool(tokens, lengths, normalize=False)
    np.testing.assert_allclose(unnormalized[1], tokens[1, :3].mean(axis=0), rtol=1e-6)


def test_a_graph_that_pools_inside_still_serves(exported, tmp_path) -> None:
    """Bundles exported before pooling moved out of the graph keep working, unchanged."""
    from training.onnx_export import _export_float

    older = tmp_path / "older"
    shutil.copytree(exported["onnx"], older)
    _export_float(default_encoder_path(), older / ONNX_FILES["onnx"], pool_inside=True)
    legacy = open_encoder(older, "onnx", batch_size=4, fixed_batch=True)
    current = open_encoder(exported["onnx"], "onnx", batch_size=4, fixed_batch=True)
    assert isinstance(legacy, OnnxSentenceEncoder)
    assert not legacy.pools_outside
    probes = list(INVARIANCE_PROBES)
    np.testing.assert_allclose(legacy.encode(probes), current.encode(probes), atol=1e-6)
    assert batch_invariance_violations(legacy, probes[:4], batch_sizes=(2, 5)) == []


def _sentence_transformers_dir(
    tmp_path: Path, modules: list[str], pooling: dict, normalize: dict | None = None
) -> Path:
    import json

    directory = tmp_path / "st"
    (directory / "1_Pooling").mkdir(parents=True)
    folders = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    entries = [
        {
            "idx": i,
            "name": str(i),
            "path": folders.get(kind, f"{i}_{kind}"),
            "type": f"sentence_transformers.models.{kind}",
        }
        for i, kind in enumerate(modules)
    ]
    (directory / "modules.json").write_text(json.dumps(entries))
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if normalize is not None:
        (directory / "2_Normalize").mkdir()
        (directory / "2_Normalize" / "config.json").write_text(json.dumps(normalize))
    return directory


MEAN = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}
STACK = ["Transformer", "Pooling", "Normalize"]


@pytest.mark.parametrize(
    ("modules", "pooling", "normalize", "expected"),
    [
        (STACK, MEAN, None, "mean+normalize"),
        (["Transformer", "Pooling"], MEAN, None, "mean"),
        (STACK, {"pooling_mode": "mean", "include_prompt": True}, None, "mean+normalize"),
        (STACK, {"pooling_mode": ["mean"]}, {}, "mean+normalize"),
        (STACK, {"pooling_mode_cls_token": False}, None, "mean+normalize"),  # none set: mean
        (STACK, {"pooling_mode": "cls", "pooling_mode_mean_tokens": True}, None, None),
        (STACK, {"pooling_mode": ["mean", "max"]}, None, None),
        (STACK, MEAN | {"pooling_mode_cls_token": True}, None, None),
        (STACK, {"pooling_mode_max_tokens": True}, None, None),
        (STACK, MEAN | {"include_prompt": False}, None, None),
        (STACK, MEAN, {"module_input_name": "token_embeddings"}, None),
        (STACK, MEAN, {"module_output_name": "normalized"}, None),
        (["Transformer", "Pooling", "Dense", "Normalize"], MEAN, None, None),
        (["Transformer", "Normalize"], MEAN, None, None),
    ],
)
def test_only_mean_pooling_moves_out_of_the_graph(
    tmp_path, modules, pooling, normalize, expected
) -> None:
    directory = _sentence_transformers_dir(tmp_path, modules, pooling, normalize)
    assert onnx_encoder.pooling_of(directory) == expected


def test_pooling_configs_outside_the_directory_are_not_read(tmp_path) -> None:
    import json

    directory = _sentence_transformers_dir(tmp_path, STACK, MEAN)
    entries = json.loads((directory / "modules.json").read_text())
    for path in ("../elsewhere", str(directory / "1_Pooling")):
        entries[1]["path"] = path
        (directory / "modules.json").write_text(json.dumps(entries))
        assert onnx_encoder.pooling_of(directory) is None
    (directory / "modules.json").write_text("not json")
    assert onnx_encoder.pooling_of(directory) is None


def test_the_real_encoders_stack_pools_outside() -> None:
    assert onnx_encoder.pooling_of(default_encoder_path()) == "mean+normalize"
    assert onnx_encoder.pooling_of(Path("/nonexistent")) is None


def test_mean_pool_refuses_lengths_that_do_not_fit() -> None:
    tokens = np.ones((2, 4, 3), dtype=np.float32)
    for lengths in ([4], [4, 4, 4], [5, 1], [-1, 2]):
        with pytest.raises(InputError, match="need a length"):
            onnx_encoder.mean_pool(tokens, lengths, normalize=True)
    np.testing.assert_array_equal(onnx_encoder.mean_pool(tokens, [0, 4], normalize=True)[0], 0.0)


def test_a_graph_ending_at_tokens_needs_a_pooling_sentdp_knows(exported, tmp_path) -> None:
    import json

    import onnx
    from onnx import TensorProto, helper

    edited = tmp_path / "edited"
    shutil.copytree(exported["onnx"], edited)
    config = edited / "1_Pooling" / "config.json"
    config.write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(InputError, match="does not describe a mean pooling"):
        open_encoder(edited, "onnx")

    odd = tmp_path / "odd"
    shutil.copytree(exported["onnx"], odd)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["something_else"], to=TensorProto.FLOAT)],
        "odd",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "t"])],
        [helper.make_tensor_value_info("something_else", TensorProto.FLOAT, ["b", "t"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(odd / ONNX_FILES["onnx"]))
    with pytest.raises(InputError, match="has outputs \\['something_else'\\]"):
        open_encoder(odd, "onnx")


def test_the_export_keeps_pooling_inside_when_sentdp_would_pool_differently(
    tmp_path, monkeypatch
) -> None:
    """A config sentdp misread must not move the pooling out of the graph: the export first
    compares sentdp's pooling with the stack's own on an example batch."""
    import onnx

    from training import onnx_export

    stack = SentenceEncoder(default_encoder_path(), "cpu").stack
    example = stack.tokenizer(
        ["A short one.", "A longer example sentence, with a clause."],
        padding="max_length",
        max_length=16,
        return_tensors="pt",
    )
    assert onnx_export._pools_like_the_stack(stack, example, "mean+normalize")
    assert not onnx_export._pools_like_the_stack(stack, example, "mean")  # unnormalized
    assert not onnx_export._pools_like_the_stack(stack, example, None)

    monkeypatch.setattr(onnx_export, "pooling_of", lambda _: "mean")  # a misreading
    graph = tmp_path / "model.onnx"
    onnx_export._export_float(default_encoder_path(), graph)
    assert [o.name for o in onnx.load(str(graph)).graph.output] == [SENTENCE_OUTPUT]


def test_an_onnx_bundle_without_a_digest_of_its_files_is_refused(exported, tmp_path) -> None:
    directory = _onnx_bundle(exported, "onnx", tmp_path)
    bundle = Bundle.load(directory)
    encoder = {k: v for k, v in bundle.manifest.encoder.items() if k != "files_sha256"}
    stripped = dataclasses.replace(
        bundle, manifest=bundle.manifest.model_copy(update={"encoder": encoder})
    )
    with pytest.raises(InputError, match="records no digest of its files"):
        stripped.check_encoder()


def test_a_bundle_refuses_an_encoder_that_opens_otherwise_than_it_trained(
    exported, tmp_path
) -> None:
    directory = _onnx_bundle(exported, "onnx", tmp_path)
    bundle = Bundle.load(directory)
    opened = open_encoder(bundle.encoder_dir, bundle.encoder_backend)
    assert bundle.manifest.encoder["pooling"] == opened.describe()["pooling"] == "mean+normalize"
    bundle.check_opened_encoder(opened)
    for key, other in (("pooling", "graph"), ("dim", 768), ("max_tokens", 128)):
        encoder = bundle.manifest.encoder | {key: other}
        changed = dataclasses.replace(
            bundle, manifest=bundle.manifest.model_copy(update={"encoder": encoder})
        )
        with pytest.raises(InputError, match=f"trained with {key}"):
            changed.check_opened_encoder(opened)
