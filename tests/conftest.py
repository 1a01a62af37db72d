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


def postgres_url() -> str | None:
    return os.environ.get("SENTDP_TEST_POSTGRES_URL")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(url, schema) of a fresh ledger: its own SQLite file, or its own PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}", "public"
        return
    url = postgres_url()
    if url is None:
        pytest.skip("SENTDP_TEST_POSTGRES_URL is not set (.ci/test sets it)")
    import uuid

    from service.ledger.postgres import PostgresLedger

    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield url, schema
    PostgresLedger(url, schema).drop_schema()
