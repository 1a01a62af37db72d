"""Settings of the offline pipeline, read from ``SENTDP_*`` environment variables."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sentdp.encoders import OnnxThreading, named_device
from sentdp.errors import SettingsError
from sentdp.torch_bert import CpuLinear


class TrainingSettings(BaseSettings):
    """Where caches live and how hard to use the machine; flags of ``sentdp-train`` win."""

    model_config = SettingsConfigDict(env_prefix="SENTDP_", extra="ignore")

    cache_dir: Path = Field(default_factory=lambda: platformdirs.user_cache_path("sentdp"))
    """Downloaded corpora (sha256-verified) and cached sentence embeddings."""
    encoder_dir: Path | None = None
    """A sentence-transformers model directory for G; the packaged MiniLM when unset."""
    device: str | None = None
    """torch device for G; unset or ``auto``: CUDA when present, else the CPU."""
    encode_batch_size: int = Field(default=64, ge=1)
    threads: int = Field(default=2, ge=1)
    """torch threads: fixed so that re-runs are byte-identical (and the ONNX encoder's)."""
    encoder_threading: OnnxThreading = "rows"
    """How an ONNX encoder uses its threads: on row pieces of each pass side by side, or
    inside each operator (as the service's ``SENTDP_ENCODER_THREADING``)."""
    cpu_linear: CpuLinear = "auto"
    """How the torch encoder runs its linear layers on the CPU (as the service's
    ``SENTDP_CPU_LINEAR``): the bundle records ``onednn`` when it ran, and the embeddings
    cache keeps the two apart."""

    @field_validator("device")
    @classmethod
    def _auto_is_unset(cls, device: str | None) -> str | None:
        return named_device(device)


def load_settings() -> TrainingSettings:
    """Build the settings now (not at import time), so callers can set the environment first;
    a ``SENTDP_*`` variable that cannot be used is a :class:`~sentdp.errors.SettingsError`,
    which every command line reports as a message."""
    try:
        return TrainingSettings()
    except ValidationError as error:
        problem = SettingsError.from_validation(error)
    # raised out here, so that pydantic's error (it quotes the values) is not its context
    raise problem
