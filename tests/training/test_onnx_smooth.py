"""SmoothQuant's rewrite of the float graph before int8 quantization must keep the graph's
function: x W = (x / s)(s W) for every product, however its weights are shared."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from sentdp.errors import InputError  # noqa: E402
from training.onnx_export import _products, _smooth  # noqa: E402


def shared_weight_graph(w: np.ndarray) -> onnx.ModelProto:
    """A = X W, B = A W (a weight two products share) and C = Gather(W, ids) (read elsewhere)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="first"),
        helper.make_node("MatMul", ["a", "w"], ["b"], name="second"),
        helper.make_node("Gather", ["w", "ids"], ["c"], name="rows"),
    ]
    graph = helper.make_graph(
        nodes,
        "shared",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2]),
        ],
        [
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 8]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 8]),
        ],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model: onnx.ModelProto, x: np.ndarray, ids: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["b", "c"], {"x": x, "ids": ids})  # type: ignore[no-any-return]


def test_smoothing_keeps_the_function_of_a_graph_that_shares_a_weight() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 8)).astype(np.float32)
    x = (rng.normal(size=(3, 8)) * np.linspace(0.1, 30, 8)).astype(np.float32)  # outlier channels
    ids = np.array([1, 6], dtype=np.int64)
    model = shared_weight_graph(w)
    before = run(model, x, ids)

    weights, products = _products(model)
    assert [node.name for node in products] == ["first", "second"]
    a = x @ w
    maxima = [np.abs(x).max(axis=0), np.abs(a).max(axis=0)]
    _smooth(model, products, weights, maxima)
    onnx.checker.check_model(model)
    after = run(model, x, ids)

    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(after[1], before[1])  # the Gather still reads W itself
    scaled = {init.name for init in model.graph.initializer if "_smooth_weight_" in init.name}
    assert scaled == {"w_smooth_weight_for_first", "w_smooth_weight_for_second"}  # one each


def test_an_original_weight_no_node_reads_any_more_is_dropped() -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 8)).astype(np.float32)
    model = shared_weight_graph(w)
    del model.graph.node[2]  # no Gather: only the two products read W
    del model.graph.output[1]
    del model.graph.input[1]
    weights, products = _products(model)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    _smooth(model, products, weights, [np.abs(x).max(axis=0), np.abs(x @ w).max(axis=0)])
    assert "w" not in {init.name for init in model.graph.initializer}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (b,) = session.run(["b"], {"x": x})
    np.testing.assert_allclose(b, x @ w @ w, rtol=1e-5, atol=1e-4)


def test_a_weight_the_caller_can_feed_is_not_smoothed_and_unnamed_products_are_refused() -> None:
    w = np.eye(8, dtype=np.float32)
    model = shared_weight_graph(w)
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 8]))
    with pytest.raises(InputError, match="no weight products"):
        _products(model)  # W is an input with a default: smoothing it would not be x W
    model = shared_weight_graph(w)
    model.graph.node[1].name = ""
    with pytest.raises(InputError, match="unique name"):
        _products(model)
    model.graph.node[1].name = "first"
    with pytest.raises(InputError, match="unique name"):
        _products(model)
