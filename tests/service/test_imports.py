"""What a server process imports: each heavy package is paid for in every process's memory."""

from __future__ import annotations

import subprocess
import sys


def test_the_serving_path_imports_neither_nltk_nor_scipy() -> None:
    """``import nltk`` pulls SciPy's statistics into every server process (~100 MiB each)."""
    heavy = ("nltk", "scipy", "sklearn", "torch", "sentence_transformers")
    code = (
        "import sys, service.gateway, service.worker\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
