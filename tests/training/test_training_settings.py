"""Training's settings read from the environment."""

from __future__ import annotations

import pytest

from sentdp.encoders import named_device, pick_device
from training.settings import load_settings


@pytest.mark.parametrize(
    ("value", "device"),
    [
        ("auto", None),
        ("AUTO", None),
        ("", None),
        ("cpu", "cpu"),
        ("cuda:1", "cuda:1"),
        (" CUDA ", "cuda"),
    ],
)
def test_auto_names_no_device(
    monkeypatch: pytest.MonkeyPatch, value: str, device: str | None
) -> None:
    """``SENTDP_DEVICE=auto``, the README's name for the default, was passed to torch as a
    device name (training and the worker failed on it)."""
    monkeypatch.setenv("SENTDP_DEVICE", value)
    assert load_settings().device == device
    assert named_device(value) == device
    if device is None:
        assert pick_device(value) in ("cpu", "cuda")
