"""A real server of two gateway and two worker processes: once one worker process refuses to
serve, the whole server says not ready, whichever processes a probe reaches."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support import (
    FAULTY_TARGET,
    TENANTS,
    Server,
    error_of,
    log_events,
    privatize,
    sqlite_server_env,
)

pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_one_closed_worker_process_makes_the_whole_server_not_ready(
    quick_bundle_tag: str, tmp_path: Path
) -> None:
    env = sqlite_server_env(
        tmp_path,
        quick_bundle_tag,
        SENTDP_GATEWAY_WORKERS="2",
        SENTDP_WORKER_PROCESSES="2",
    )
    server = Server(env, target=FAULTY_TARGET, log=tmp_path / "server.log").start()
    try:
        closing = privatize(
            server, "c-user", 1.0, TENANTS[0].key, documents=[{"sentences": ["FAULT:close"]}]
        )
        assert closing.status_code == 503, closing.text
        error = error_of(closing)
        assert (error["code"], error["released"]) == ("worker_unavailable", [])
        assert "refuses to serve" in error["message"]
        time.sleep(1.5)  # past the gateways' one-second cache of a ready probe
        answers = []
        for _ in range(40):  # new connections: both gateway processes, both worker processes
            answers.append(httpx.get(f"{server.url}/readyz", timeout=10).status_code)
            time.sleep(0.1)
        assert set(answers) == {503}, answers
        budget = httpx.post(
            f"{server.url}/budget",
            json={"user": "c-user"},
            headers={"Authorization": f"Bearer {TENANTS[0].key}"},
            timeout=30,
        )
        assert budget.json()["spent_epsilon"] == 0  # refunded
        # the gateways' probes reuse one connection each: the file is what every worker reads
        assert (Path(str(server.home)) / "prometheus_multiproc_dir/sentdp-worker-closed").exists()
    finally:
        server.stop()
    assert len(log_events(server.log, "worker_refusing_to_serve")) == 1  # type: ignore[arg-type]
