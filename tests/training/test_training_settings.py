"""Training's settings read from the environment."""

from __future__ import annotations

import pytest

from sentdp.encoders import named_device, pick_device
from sentdp.errors import InputError, SettingsError
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


@pytest.mark.parametrize("value", ["bogus", "meta", "cpu:1", "ünï", "cuda:x", "cuda:1:2"])
def test_a_device_torch_has_no_name_for_is_refused_before_the_run(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """They failed deep in a run (a SafetensorError after the corpus was read)."""
    monkeypatch.setenv("SENTDP_DEVICE", value)
    with pytest.raises(SettingsError, match="SENTDP_DEVICE: the device must be auto, cpu"):
        load_settings()


def test_a_cuda_device_the_machine_lacks_is_refused() -> None:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(InputError, match=f"device cuda:{count} was asked for; this machine has"):
        pick_device(f"cuda:{count}")
