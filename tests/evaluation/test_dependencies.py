"""Dependencies point one way: evaluation -> training -> sentdp; nothing imports evaluation."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_packages(package: str) -> set[str]:
    """The top-level names every module of ``package`` imports (absolute imports only)."""
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    return found


@pytest.mark.parametrize("package", ["sentdp", "training", "service"])
def test_nothing_below_evaluation_imports_it(package: str) -> None:
    assert not {m for m in imported_packages(package) if m.split(".")[0] == "evaluation"}


def test_evaluation_does_not_import_the_training_pipeline() -> None:
    imported = imported_packages("evaluation")
    assert "training.pipeline" not in imported
    assert not {m for m in imported if m.split(".")[0] == "service"}
