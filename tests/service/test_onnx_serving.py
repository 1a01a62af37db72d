"""A bundle trained with an ONNX Runtime backend, served for real: answers without torch in
any server process, and refuses to start where the deployment expects another backend."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from loadtests.cold_start import start_parts
from tests.support import LOG_FIELDS, TENANTS, Server, log_events, privatize, sqlite_server_env

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def int8_tag() -> str:
    from training.pipeline import TrainConfig, run_training
    from training.settings import load_settings

    config = TrainConfig(
        dataset="bbc-news", name="sentdp-test-int8", encoder_backend="onnx-int8"
    ).quick()
    return run_training(config, load_settings()).tag


def serve(
    tag: str,
    folder: Path,
    expected: str,
    timeout: float = 300.0,
    refused: str | None = None,
    **extra: str,
) -> Server:
    env = sqlite_server_env(folder, tag, SENTDP_ENCODER_BACKEND=expected, **extra)
    return Server(env, log=folder / "server.log").start(timeout, refused)


LATER = [24, 48, 96, 128, 192, 256]
"""all-MiniLM-L6-v2's buckets that the start-up probes miss."""


def events(folder: Path, name: str) -> list[dict[str, Any]]:
    """The events called ``name`` in the log of the server of ``folder``."""
    return log_events(folder / "server.log", name)


def test_an_int8_bundle_serves_without_torch(int8_tag, tmp_path) -> None:
    """... and, once ready, checks the buckets its start-up probes miss, smallest first; a
    document with a sentence of about 200 tokens is served. ``loadtests/cold_start.py``
    reads from its log where the cold start went."""
    server = serve(int8_tag, tmp_path, "onnx-int8")
    ready = time.time()
    try:
        long = " ".join(["The council approved the budget for roads and schools"] * 20) + "."
        text = f"{long} Rates rose. The film ended. It rained in Leeds."
        response = privatize(server, "onnx-user", 2.0, TENANTS[0].key, documents=[{"text": text}])
        assert response.status_code == 200, response.text
        (document,) = response.json()["documents"]
        assert (document["k"], len(document["embedding"])) == (4, 384)
        mapped = {Path(m.path).name for p in server._tree() for m in p.memory_maps() if m.path}
        assert any(name.startswith("libonnxruntime") for name in mapped)
        assert not any(name.startswith("libtorch") for name in mapped)
        deadline = time.monotonic() + 120
        while len(events(tmp_path, "encoder_bucket_checked")) < len(LATER):
            assert time.monotonic() < deadline, "the later bucket checks did not end"
            time.sleep(0.5)
    finally:
        server.stop()
    (started,) = events(tmp_path, "encoder_buckets_checked")
    assert (started["buckets"], started["later"]) == ([8, 16, 32, 64], LATER)
    checked = events(tmp_path, "encoder_bucket_checked")
    assert [(e["bucket"], e["when"]) for e in checked] == [(b, "later") for b in LATER]
    assert not events(tmp_path, "encoder_bucket_moved")
    (phases,) = events(tmp_path, "worker_start_phases")  # no torch_start: ONNX only
    seconds = {k: v for k, v in phases.items() if k not in LOG_FIELDS}
    assert list(seconds) == ["bundle", "encoder_open", "start_up_check", "mechanisms", "warm_up"]
    assert all(isinstance(v, float) and v >= 0 for v in seconds.values())
    assert seconds["start_up_check"] > 0.05  # a real check encodes some hundred rows
    parts = start_parts(server, ready)
    after = ["later checks", "dispatcher warm-up", "rest"]
    assert list(parts) == ["launch to worker start", *seconds, *after]
    assert parts["launch to worker start"] > 0.3  # processes started, imports
    assert parts["later checks"] > 0.05  # six buckets checked before ready
    assert min(parts.values()) > -0.05  # log times are to the millisecond: no part overlaps


def test_a_deployment_expecting_torch_refuses_the_int8_bundle(int8_tag, tmp_path) -> None:
    refusal = "trained with the onnx-int8 encoder backend and cannot serve with torch"
    with pytest.raises(RuntimeError, match="refused to start"):
        serve(int8_tag, tmp_path, "torch", timeout=120, refused=refusal)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert refusal in log


def test_a_worker_asked_to_check_every_bucket_does_so_before_it_serves(int8_tag, tmp_path) -> None:
    server = serve(int8_tag, tmp_path, "onnx-int8", SENTDP_CHECK_EVERY_BUCKET="true")
    try:
        assert privatize(server, "onnx-user", 2.0, TENANTS[0].key).status_code == 200
    finally:
        server.stop()
    (line,) = [
        line
        for line in (tmp_path / "server.log").read_text(errors="replace").splitlines()
        if "encoder_buckets_checked" in line
    ]
    assert "[8, 16, 24, 32, 48, 64, 96, 128, 192, 256]" in line
    (started,) = events(tmp_path, "encoder_buckets_checked")
    assert (started["unchecked"], started["later"]) == ([], [])
    checked = events(tmp_path, "encoder_bucket_checked")
    assert [(e["bucket"], e["when"]) for e in checked] == [(b, "start-up") for b in LATER]
