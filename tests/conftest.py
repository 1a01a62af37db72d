"""Shared fixtures: one real encoder per session, an isolated BentoML home per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def encoder():  # type: ignore[no-untyped-def]
    """The packaged all-MiniLM-L6-v2, loaded once (real weights, CPU)."""
    import torch

    from sentdp.encoders import SentenceEncoder

    torch.set_num_threads(2)
    return SentenceEncoder(device="cpu")


@pytest.fixture(scope="session", autouse=True)
def bentoml_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Tests never touch the user's model store: BENTOML_HOME points at a temporary folder."""
    home = tmp_path_factory.mktemp("bentoml_home")
    previous = os.environ.get("BENTOML_HOME")
    os.environ["BENTOML_HOME"] = str(home)
    yield home
    if previous is None:
        os.environ.pop("BENTOML_HOME", None)
    else:
        os.environ["BENTOML_HOME"] = previous
