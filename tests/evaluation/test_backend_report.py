"""The per-backend table: methods matched by kind, differences from the first backend."""

from __future__ import annotations

from evaluation.backend_report import render


def results(model: str, shift: float) -> dict[str, object]:
    def sweep(base: float) -> dict[str, dict[str, float]]:
        return {"1.0": {"mean": base + shift}, "3.0": {"mean": base + 0.1 + shift}}

    return {
        "corpus": "bbc-news",
        "test_documents": 317,
        "trials": 5,
        "epsilons": [1.0, 3.0],
        "command": f"sentdp-eval --model {model}",
        "eps_sweep": {
            f"deepcandidate:{model}": sweep(0.5),
            "nonprivate": sweep(0.9),
            "random_guess": sweep(0.2),
        },
    }


def test_rows_per_backend_with_differences_from_the_reference() -> None:
    table = render({"torch": results("a-torch", 0.0), "onnx-int8": results("a-int8", -0.02)})
    assert "| deepcandidate | torch | 0.500 | 0.600 |" in table
    assert "| deepcandidate | onnx-int8 | 0.480 (-0.020) | 0.580 (-0.020) |" in table
    assert "| nonprivate | onnx-int8 | 0.880 (-0.020) | 0.980 (-0.020) |" in table
    assert "random_guess" not in table
    assert "`sentdp-eval --model a-int8`" in table
