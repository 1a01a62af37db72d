"""Export G to ONNX for the ``onnx`` and ``onnx-int8`` backends (training time, with torch).

The exported directory is the sentence-transformers directory plus ``onnx/``, so a bundle
that copies it serves without torch. The graph is the transformer of the
sentence-transformers module stack, traced once; its output is the token embeddings, which
:class:`~sentdp.onnx_encoder.OnnxSentenceEncoder` mean-pools and normalizes row by row
(ONNX Runtime's pooling inside the graph summed in an order that depended on the batch's
row count). A stack whose pooling sentdp cannot apply outside (anything but mean pooling,
optionally normalized) is traced whole, pooling included, as every graph was before.

int8 uses *static* quantization: the scales of the activations are calibrated once, on
public sentences, and fixed in the graph, so a row's result cannot depend on its batch
(dynamic quantization scales each batch by its own range and breaks that). Every product
with a weight matrix is quantized (int8 weights per output channel, uint8 activations per
tensor) and keeps a float output (ONNX Runtime's ``MatMulIntegerToFloat``): quantizing the
outputs too put the residual stream's outliers through a per-tensor scale. The products'
inputs have outlier channels a per-tensor scale cannot hold either (most of all the
feed-forward down-projections', after the GELU), so before quantizing each product is
*smoothed* (SmoothQuant, Xiao et al. 2023): input channel j is divided by
``s_j = max|x_j| ** alpha / max|w_j| ** (1 - alpha)`` (maxima over the calibration sentences
and the weight's row j) and the weight's row j multiplied by it: the same float function,
with the outliers moved into the weights. Measured on 2,000 BBC News sentences (cosine to
the float embeddings, mean / 1st percentile / minimum): 0.994 / 0.989 / 0.977 with the
down-projections left float (the export before), 0.990 / 0.983 / 0.963 smoothing only the
down-projections, 0.998 / 0.996 / 0.989 smoothing every product (now).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sentdp.encoder_layout import pooling_of
from sentdp.encoders import SentenceEncoder, encoder_files_sha256, length_buckets
from sentdp.errors import InputError
from sentdp.onnx_encoder import (
    INPUT_NAMES,
    ONNX_FILES,
    SENTENCE_OUTPUT,
    UNPOOLED_OUTPUT,
    OnnxSentenceEncoder,
    mean_pool,
)

EXPORT_FORMAT = 5
"""Bumped when the exported graph changes for the same encoder files (2: pooling outside;
4: int8 quantizes every weight product, each smoothed; 5: each product smooths its own
copy of its weight), so the export cache never hands
back a graph of an older kind."""
POOLING_TOLERANCE = 1e-5
"""How far sentdp's pooling may be from the stack's own on the export's example batch."""
SMOOTH_ALPHA = 0.75
"""How much of a product input's outliers move into its weight (SmoothQuant's alpha; with
every product smoothed, 0.75 gave a mean cosine to the float embeddings of 0.998 and 0.5 of
0.983 on BBC News sentences)."""
CALIBRATION_SENTENCES = 512
CALIBRATION_BATCH = 16
OPSET = 17


def exported_encoder(
    source: Path,
    backend: str,
    cache_dir: Path,
    calibration: Sequence[str] = (),
) -> Path:
    """An encoder directory holding ``source``'s files and its ``backend`` graph, made once
    per (source, backend, calibration text) under ``cache_dir`` and reused after."""
    if backend not in ONNX_FILES:
        raise InputError(f"no ONNX export for backend {backend!r}")
    if backend == "onnx-int8" and not calibration:
        raise InputError("int8 needs public calibration sentences")
    digest = hashlib.sha256(f"{backend}\0{EXPORT_FORMAT}\0{pooling_of(source)}\0".encode())
    digest.update(encoder_files_sha256(source).encode())
    if backend == "onnx-int8":
        for sentence in calibration:
            digest.update(sentence.encode() + b"\0")
    target = cache_dir / "encoders" / f"{source.name}-{backend}-{digest.hexdigest()[:16]}"
    if (target / ONNX_FILES[backend]).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        shutil.copytree(source, work, dirs_exist_ok=True)
        (work / "onnx").mkdir(exist_ok=True)
        float_graph = work / ONNX_FILES["onnx"]
        _export_float(source, float_graph)
        if backend == "onnx-int8":
            _quantize(float_graph, work, calibration)
            float_graph.unlink()
        try:
            work.rename(target)
        except OSError:  # another process made it meanwhile
            if not (target / ONNX_FILES[backend]).is_file():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def _export_float(source: Path, graph: Path, pool_inside: bool | None = None) -> None:
    """Trace G to ``graph``: the transformer alone (output ``token_embeddings``) where sentdp
    can pool outside, else the whole stack (``sentence_embedding``). ``pool_inside`` forces
    one or the other (tests make a graph of the older kind with it)."""
    import torch

    stack = SentenceEncoder(source, "cpu", plain_torch=False).stack
    example = stack.tokenizer(
        ["An example sentence.", "Another, a little longer, example sentence."],
        padding="max_length",
        max_length=16,
        return_tensors="pt",
    )
    if pool_inside is None:
        pool_inside = not _pools_like_the_stack(stack, example, pooling_of(source))
    module, output = (stack, SENTENCE_OUTPUT) if pool_inside else (stack[0], UNPOOLED_OUTPUT)

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stack = module

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            embedding: torch.Tensor = self.stack(_features(input_ids, attention_mask))[output]
            return embedding

    axes = {0: "batch", 1: "tokens"}
    # The tracer warns that shape checks become constants; they hold for every input here
    # (the mask always matches the ids), and the tests compare the graph with torch at
    # every bucket length.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Embed().eval(),
            (example["input_ids"], example["attention_mask"]),
            str(graph),
            input_names=list(INPUT_NAMES[:2]),
            output_names=[output],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                output: axes if output == UNPOOLED_OUTPUT else {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )


def _features(input_ids: Any, attention_mask: Any) -> dict[str, Any]:
    """The features dict the sentence-transformers stack reads (a fresh one: it writes to it)."""
    import torch

    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": torch.zeros_like(input_ids),
    }


def _pools_like_the_stack(stack: Any, example: Any, pooling: str | None) -> bool:
    """Whether :func:`~sentdp.onnx_encoder.mean_pool` with ``pooling`` after the stack's
    transformer gives the stack's own sentence embeddings (within float rounding) on the
    example batch: a check that the configs were read as sentence-transformers reads them,
    before the pooling leaves the graph."""
    import torch

    if pooling is None:
        return False
    ids, mask = example["input_ids"], example["attention_mask"]
    with torch.no_grad():
        whole = stack(_features(ids, mask))["sentence_embedding"].numpy()
        tokens = stack[0](_features(ids, mask))["token_embeddings"].numpy()
    lengths = example["attention_mask"].sum(dim=1).tolist()
    pooled = mean_pool(tokens, lengths, normalize=pooling == "mean+normalize")
    return bool(np.abs(pooled - whole).max() < POOLING_TOLERANCE)


def _quantize(float_graph: Path, work: Path, calibration: Sequence[str]) -> None:
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = work / "onnx" / "prepared.onnx"
    quant_pre_process(str(float_graph), str(prepared), skip_symbolic_shape=True)
    model = onnx.load(str(prepared))
    weights, products = _products(model)

    floats = OnnxSentenceEncoder(work, "onnx", batch_size=CALIBRATION_BATCH)
    buckets = length_buckets(floats.max_tokens)
    feeds = []
    texts = list(calibration)[:CALIBRATION_SENTENCES]
    for start in range(0, len(texts), CALIBRATION_BATCH):
        rows = floats._ids(texts[start : start + CALIBRATION_BATCH])
        length = next(b for b in buckets if b >= max(len(r) for r in rows))
        feeds.append(floats._pad(rows, length))
    _smooth(model, products, weights, _input_maxima(prepared, products, feeds))
    onnx.save(model, str(prepared))

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._feeds, None)

    quantize_static(
        str(prepared),
        str(work / ONNX_FILES["onnx-int8"]),
        Reader(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],
        nodes_to_quantize=[node.name for node in products],
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul"]},
    )
    prepared.unlink()


def _products(model: Any) -> tuple[dict[str, Any], list[Any]]:
    """The graph's constant weights by name and the MatMul nodes that multiply by one (the
    products to smooth and quantize, which both find by node name)."""
    inputs = {value.name for value in model.graph.input}  # overridable: not constants
    weights = {init.name: init for init in model.graph.initializer if init.name not in inputs}
    products = [node for node in model.graph.node if _weight_of(node, weights) is not None]
    if not products:
        raise InputError("the encoder's graph has no weight products to quantize")
    names = [node.name for node in products]
    if not all(names) or len(set(names)) != len(names):
        raise InputError("the encoder's graph needs a unique name on every weight product")
    return weights, products


def _weight_of(node: Any, weights: dict[str, Any]) -> Any:
    """The 2-d weight matrix a MatMul node multiplies by, or None (not a weight product)."""
    if node.op_type != "MatMul":
        return None
    weight = weights.get(node.input[1])
    return weight if weight is not None and len(weight.dims) == 2 else None


def _input_maxima(graph: Path, nodes: Sequence[Any], feeds: Sequence[Any]) -> list[np.ndarray]:
    """Per input channel, the largest |activation| entering each node over the feeds."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    model = onnx.load(str(graph))
    names = [node.input[0] for node in nodes]
    model.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    maxima: list[np.ndarray] = [np.zeros(0)] * len(nodes)
    for feed in feeds:
        for index, values in enumerate(session.run(names, feed)):
            channel = np.abs(values).reshape(-1, values.shape[-1]).max(axis=0)
            maxima[index] = (
                channel if maxima[index].size == 0 else np.maximum(maxima[index], channel)
            )
    return maxima


def _smooth(
    model: Any, nodes: Sequence[Any], weights: dict[str, Any], maxima: Sequence[np.ndarray]
) -> None:
    """SmoothQuant each node: x W = (x / s) (s W), s per input channel, in place. Each node
    gets its own scaled copy of W, so a weight that several nodes share (tied weights, or a
    MatMul's weight that a Gather also reads) is never scaled twice or under another reader."""
    from onnx import helper, numpy_helper

    replaced: set[str] = set()
    for node, x_max in zip(nodes, maxima, strict=True):
        source = node.input[1]
        w = numpy_helper.to_array(weights[source]).astype(np.float32)
        w_max = np.abs(w).max(axis=1)
        scale = np.maximum(x_max, 1e-5) ** SMOOTH_ALPHA / np.maximum(w_max, 1e-5) ** (
            1 - SMOOTH_ALPHA
        )
        scale = scale.astype(np.float32)
        scaled = f"{source}_smooth_weight_for_{node.name}"
        model.graph.initializer.append(numpy_helper.from_array(w * scale[:, None], scaled))
        node.input[1] = scaled
        replaced.add(source)
        inverse = f"{node.name}_smooth_inverse"
        model.graph.initializer.append(numpy_helper.from_array(1 / scale, inverse))
        smoothed = f"{node.input[0]}_smoothed_for_{node.name}"
        position = list(model.graph.node).index(node)
        mul = helper.make_node(
            "Mul", [node.input[0], inverse], [smoothed], name=f"{node.name}_smooth"
        )
        model.graph.node.insert(position, mul)
        node.input[0] = smoothed
    read = _names_read(model.graph) | {value.name for value in model.graph.input}
    unread = [init for init in model.graph.initializer if init.name in replaced - read]
    for init in unread:  # an original no node reads any more
        model.graph.initializer.remove(init)


def _names_read(graph: Any) -> set[str]:
    """Every name a node of ``graph`` or of its subgraphs reads, and the graph's outputs."""
    names = {output.name for output in graph.output}
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            subgraphs = list(attribute.graphs)
            if attribute.HasField("g"):
                subgraphs.append(attribute.g)
            for sub in subgraphs:
                names |= _names_read(sub)
    return names
