"""The CPU image, built by deploy/build.sh from a quick bundle and run as a user would:
it refuses to start without a state volume, and with one it serves and keeps every user's
spent epsilon when the container is recreated."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support import REPO, free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def docker(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=check, timeout=timeout
    )


@pytest.fixture(scope="module")
def image(quick_bundle_tag: str) -> Iterator[str]:
    if shutil.which("docker") is None or docker("info", check=False).returncode != 0:
        pytest.skip("no Docker engine answers here")
    tag = f"sentdp-test:{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SENTDP_MODEL": quick_bundle_tag}
    built = subprocess.run(
        ["bash", "deploy/build.sh", "cpu", tag],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    yield tag
    docker("image", "rm", "-f", tag, check=False)


def test_without_a_state_volume_the_container_refuses_to_start(image: str) -> None:
    ran = docker("run", "--rm", image, check=False, timeout=300)
    assert ran.returncode != 0
    logs = ran.stdout + ran.stderr
    assert '"event": "refusing_to_start"' in logs
    assert "would be lost with it" in logs


def test_a_recreated_container_keeps_the_users_spent_epsilon(image: str) -> None:
    volume = f"sentdp-test-{uuid.uuid4().hex[:8]}"
    name = f"sentdp-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    mount = f"{volume}:/state"
    try:
        key = docker(
            "run", "--rm", "-v", mount, image,
            "sentdp-admin", "new-key", "--tenant", "t", "--max-epsilon", "5", "--budget", "50",
        ).stdout.strip().splitlines()[-1]  # fmt: skip
        spent = []
        for _ in range(2):
            docker("rm", "-f", name, check=False)
            docker("run", "-d", "--name", name, "-p", f"{port}:3000", "-v", mount, image)
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, name)
            response = httpx.post(
                f"{url}/privatize",
                headers={"Authorization": f"Bearer {key}"},
                json={"user": "u", "epsilon": 2.0, "documents": [{"text": "One. Two. Three."}]},
                timeout=120,
            )
            assert response.status_code == 200, response.text
            spent.append(response.json()["budget"]["spent_epsilon"])
        assert spent == [2.0, 4.0]  # the second container saw the first one's charge
    finally:
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", "-f", volume, check=False)


def wait_ready(url: str, name: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        state = docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", docker("logs", name, check=False).stderr[-3000:]
        time.sleep(1)
    raise AssertionError(f"{name} not ready after {timeout} s")
