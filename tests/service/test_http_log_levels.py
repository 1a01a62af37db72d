"""The server's own log of a body the request schema refuses, as an operator reads it."""

from __future__ import annotations

import pytest

from tests.support import TENANTS, client

pytestmark = pytest.mark.server

ACME = TENANTS[0]


def test_a_body_the_schema_refuses_is_one_warning_line_in_the_server_log(server) -> None:
    assert server.log is not None
    with client(server, ACME.key) as http:
        response = http.post("/privatize", json={"epsilon": 1.0, "documents": [{"text": "A."}]})
    assert response.status_code == 400
    lines = [
        line
        for line in server.log.read_text(errors="replace").splitlines()
        if "refused as the caller's error" in line
    ]
    assert len(lines) == 1
    assert "[WARNING]" in lines[0]
    assert "[ERROR]" not in lines[0]  # BentoML's own filter had already set it
