"""The worker's test-only faults cannot be turned on by a deployment: no setting reads a
marker, and no Bento packs the module that sets one (tests/faulty_server.py)."""

from __future__ import annotations

from pathlib import Path

import pathspec
import pytest
import yaml

from service.schemas import WorkItem
from tests.support import REPO

BENTOFILES = ["bentofile.yaml", "deploy/bentofile-cpu.yaml", "deploy/bentofile-gpu.yaml"]


def item(first: str) -> WorkItem:
    return WorkItem(charge_id=1, model="m", variant="v", sentences=[first, "x"], epsilon=1.0, p=1)


def test_the_old_variable_turns_no_fault_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from service import worker
    from service.settings import load_settings

    monkeypatch.setenv("SENTDP_FAULT_MARKER", "FAULT")
    assert not hasattr(load_settings(), "fault_marker")
    assert worker.FAULT_MARKER is None  # nothing in the product's import path sets it
    for stage in ("before", "after", "close"):
        assert not worker.faulted(worker.FAULT_MARKER, [item(f"FAULT:{stage}")], stage)
    assert worker.faulted("FAULT", [item("FAULT:close")], "close")  # the tests' own server


@pytest.mark.parametrize("bentofile", BENTOFILES)
def test_no_bento_packs_the_module_that_turns_faults_on(bentofile: str) -> None:
    include = yaml.safe_load((REPO / bentofile).read_text())["include"]
    packed = pathspec.PathSpec.from_lines("gitwildmatch", include)
    assert packed.match_file("service/worker.py")
    assert packed.match_file("service/ledger/sql.py")
    assert Path(REPO / "tests/faulty_server.py").is_file()
    assert not packed.match_file("tests/faulty_server.py")
    assert not any(packed.match_file(str(p.relative_to(REPO))) for p in REPO.glob("tests/**/*"))
