"""No launcher or image of sentdp sends BentoML's usage reports (request counts by endpoint and
status, model saves) to BentoML's makers unless the operator asks for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import REPO

BENTOFILES = [REPO / "bentofile.yaml", *sorted((REPO / "deploy").glob("bentofile-*.yaml"))]


@pytest.mark.parametrize("bentofile", BENTOFILES, ids=lambda p: p.name)
def test_every_image_turns_bentoml_s_usage_reports_off(bentofile: Path) -> None:
    envs = {e["name"]: e["value"] for e in yaml.safe_load(bentofile.read_text())["envs"]}
    assert envs["BENTOML_DO_NOT_TRACK"] == "true"


def test_the_serve_launcher_turns_them_off_unless_the_operator_set_it() -> None:
    assert "export BENTOML_DO_NOT_TRACK=${BENTOML_DO_NOT_TRACK:-true}" in (
        (REPO / ".ci" / "serve").read_text()
    )


@pytest.mark.parametrize(("given", "expected"), [(None, "true"), ("false", "false")])
def test_the_clis_that_save_to_the_store_turn_them_off_unless_asked(
    given: str | None, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BENTOML_DO_NOT_TRACK"}
    if given is not None:
        env["BENTOML_DO_NOT_TRACK"] = given
    read = "import os, training.cli; print(os.environ['BENTOML_DO_NOT_TRACK'])"
    shown = subprocess.run(
        [sys.executable, "-c", read], env=env, cwd=REPO, capture_output=True, text=True, check=False
    )
    assert shown.stdout.strip() == expected, shown.stderr[-2000:]
