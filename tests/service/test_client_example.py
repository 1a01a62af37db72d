"""The client example as a new user runs it: a refusal ends in one line, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest


class Refusing(BaseHTTPRequestHandler):
    """Answers every POST as sentdp answers a wrong API key."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps(
            {"error": {"code": "unauthorized", "message": "missing or unknown API key"}}
        ).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def refusing_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


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
