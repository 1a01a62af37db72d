"""The server's own log of a body the request schema refuses, as an operator reads it."""

from __future__ import annotations

import pytest

from tests.support import TENANTS, client, wait_for

pytestmark = pytest.mark.server

ACME = TENANTS[0]


def test_a_body_the_schema_refuses_is_one_warning_line_in_the_server_log(server) -> None:
    assert server.log is not None
    start = len(server.log.read_bytes())  # the server is shared: only this test's lines

    def refused() -> list[str]:
        text = server.log.read_bytes()[start:].decode(errors="replace")
        return [line for line in text.splitlines() if "refused as the caller's error" in line]

    with client(server, ACME.key) as http:
        response = http.post("/privatize", json={"epsilon": 1.0, "documents": [{"text": "A."}]})
    assert response.status_code == 400
    wait_for(lambda: bool(refused()), timeout=10)
    (line,) = refused()
    assert "[WARNING]" in line
    assert "[ERROR]" not in line  # BentoML's own filter had already set it
