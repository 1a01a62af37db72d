"""Shared fixtures: a real encoder, a quick real bundle, and a real server, once per session.

Tests never touch the user's model store: BENTOML_HOME points at a temporary folder before
anything imports BentoML. Public corpora are cached (sha256-verified) under .sentdp/cache.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_BENTOML_HOME = tempfile.mkdtemp(prefix="sentdp-test-bentoml-")
os.environ["BENTOML_HOME"] = _BENTOML_HOME
os.environ["BENTOML_DO_NOT_TRACK"] = "true"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("SENTDP_CACHE_DIR", str(REPO / ".sentdp" / "cache"))
# Test servers run two gateway processes whatever the machine's default (one on 2 cores), so
# the ledger's cross-process races and refunds are exercised.
os.environ.setdefault("SENTDP_GATEWAY_WORKERS", "2")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_BENTOML_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def bentoml_home() -> Path:
    return Path(_BENTOML_HOME)


@pytest.fixture(scope="session")
def quick_bundle_tag() -> str:
    """A --quick bundle trained on a small real slice of BBC News, in the test model store.
    Its votes are simplex votes drawn by count (``--vote-shape simplex``), so the served-path
    tests of the count rule and of the zCDP draw meet that rule whatever validation would
    pick on the slice; cube votes are tested in tests/sentdp/test_labels.py, through the
    charging flow in tests/service/test_charging.py, and trained in test_pipeline.py."""
    from training.pipeline import TrainConfig, run_training
    from training.settings import load_settings

    config = TrainConfig(dataset="bbc-news", name="sentdp-test", vote_shapes=("simplex",))
    report = run_training(config.quick(), load_settings())
    return report.tag


@pytest.fixture(scope="session")
def mean_bundle_tag(quick_bundle_tag: str) -> str:
    """The quick bundle with its top epsilon drawn by the clipped-mean rule (format version
    6 or later) at the median norm of that variant's candidates: real G, H and F, a p table made by
    hand so the service's mean path runs whatever validation would pick."""
    import numpy as np

    from training.store import load_from_store, save_to_store

    bundle = load_from_store(quick_bundle_tag)
    top = bundle.manifest.p_table[-1]
    norms = np.linalg.norm(bundle.variant(top.variant).candidates, axis=1)
    mean = top.model_copy(update={"selection": "mean", "p": 1, "radius": float(np.median(norms))})
    version = max(6, bundle.manifest.format_version)  # 7 where the quick bundle's vote is a cube
    manifest = bundle.manifest.model_copy(
        update={"format_version": version, "p_table": [*bundle.manifest.p_table[:-1], mean]}
    )
    derived = dataclasses.replace(bundle, manifest=manifest)
    return save_to_store(derived, "sentdp-test-mean", {"derived_from": quick_bundle_tag})


@pytest.fixture(scope="session")
def cube_bundle_tag(quick_bundle_tag: str) -> str:
    """The quick bundle with each vote made a calibrated cube vote by training's own
    :func:`training.vote_calibration.calibrated` (a scale and an offset per class, fixed here
    rather than fitted, so the draw is far from the uncalibrated cube's), format version 7:
    the served path of the calibrated votes validation picks on clothing reviews."""
    from tests.support import cube_calibration
    from training.store import load_from_store, save_to_store
    from training.vote_calibration import calibrated

    bundle = load_from_store(quick_bundle_tag)
    votes = tuple(calibrated(vote, *cube_calibration(vote)) for vote in bundle.votes)
    # every document by the cube vote's own rule (the path under test), not the hard-vote
    # table validation may have chosen for the quick bundle's other votes
    p_table = [choice.model_copy(update={"vote_table": 0}) for choice in bundle.manifest.p_table]
    manifest = bundle.manifest.model_copy(
        update={
            "format_version": max(7, bundle.manifest.format_version),
            "vote_shapes": ["cube"] * len(votes),
            "p_table": p_table,
        }
    )
    derived = dataclasses.replace(bundle, votes=votes, manifest=manifest)
    return save_to_store(derived, "sentdp-test-cube", {"derived_from": quick_bundle_tag})


@pytest.fixture(scope="session")
def encoder():  # type: ignore[no-untyped-def]
    """The packaged all-MiniLM-L6-v2, loaded once (real weights, CPU). On a GPU machine,
    SENTDP_TEST_DEVICE=cuda runs the encoder tests there, and SENTDP_TEST_ENCODER_DIR names
    the same encoder's directory where the package is not installed (a bundle's copy)."""
    import torch

    from sentdp.encoders import SentenceEncoder

    torch.set_num_threads(2)
    directory = os.environ.get("SENTDP_TEST_ENCODER_DIR") or None
    return SentenceEncoder(directory, device=os.environ.get("SENTDP_TEST_DEVICE", "cpu"))


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


@pytest.fixture(scope="session")
def server(quick_bundle_tag: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real `bentoml serve` (2 gateway workers + the batched worker) on an SQLite ledger,
    with small limits, a sample journal and the test-only faults (:mod:`tests.faulty_server`)."""
    from tests.support import FAULTY_TARGET, Server, sqlite_server_env

    folder = tmp_path_factory.mktemp("server")
    env = sqlite_server_env(
        folder,
        quick_bundle_tag,
        SENTDP_SAMPLE_JOURNAL=str(folder / "journal.txt"),
        SENTDP_MAX_SENTENCES="40",
        SENTDP_MAX_DOCUMENTS="4",
        SENTDP_MAX_BODY_BYTES="65536",
        SENTDP_BATCH_MAX_SENTENCES="100",  # small enough for a test request to exceed
    )
    started = Server(env, target=FAULTY_TARGET, log=folder / "server.log").start()
    yield started
    started.stop()
