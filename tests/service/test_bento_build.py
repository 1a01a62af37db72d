"""`bentoml build` makes a Bento that serves on its own (`bentoml serve <tag>` from elsewhere)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, TENANTS, Server, client, write_tenants

pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_a_built_bento_serves_privatize(quick_bundle_tag: str, tmp_path: Path) -> None:
    import os

    env = {**os.environ, "SENTDP_MODEL": quick_bundle_tag}
    built = subprocess.run(
        [str(Path(sys.executable).parent / "bentoml"), "build", "-o", "tag"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    tag = built.stdout.strip().splitlines()[-1].removeprefix("__tag__:")
    assert tag.startswith("sentdp:")
    name, version = tag.split(":")
    source = Path(os.environ["BENTOML_HOME"]) / "bentos" / name / version.lower() / "src"
    assert (source / "service" / "worker.py").is_file()
    assert not (source / "tests").exists()  # tests/faulty_server.py turns faults on
    served_from = tmp_path / "elsewhere"  # not the repository: the Bento carries its own code
    served_from.mkdir()
    server = Server(
        {
            "SENTDP_MODEL": quick_bundle_tag,
            "SENTDP_TENANTS_FILE": str(write_tenants(tmp_path / "tenants.json")),
            "SENTDP_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.sqlite3'}",
        },
        target=tag,
        log=tmp_path / "server.log",
        cwd=served_from,
    ).start()
    try:
        with client(server, TENANTS[0].key) as http:
            response = http.post(
                "/privatize",
                json={"user": "b", "epsilon": 2.0, "documents": [{"text": "One. Two. Three."}]},
            )
        assert response.status_code == 200, response.text
        assert response.json()["model"] == quick_bundle_tag
        assert len(response.json()["documents"][0]["embedding"]) == 384
    finally:
        server.stop()
