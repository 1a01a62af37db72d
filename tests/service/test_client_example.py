"""The client example as a new user runs it: a refusal ends in one line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support import json_server

REFUSAL = {"error": {"code": "unauthorized", "message": "missing or unknown API key"}}
"""How sentdp answers a wrong API key."""


@pytest.fixture
def refusing_url() -> Iterator[str]:
    with json_server(lambda path: (401, REFUSAL)) as url:
        yield url


def test_a_wrong_key_ends_the_example_with_one_line_that_says_what_to_pass(
    refusing_url: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sentdp_client.example", refusing_url, ".sentdp/demo-api-key"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "401 unauthorized: missing or unknown API key (pass the key itself, e.g. "
        '"$(cat .sentdp/demo-api-key)")'
    ]
