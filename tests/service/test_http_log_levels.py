"""The server's own log of a body the request schema refuses, as an operator reads it."""

from __future__ import annotations

import json

import pytest

from tests.support import TENANTS, client, wait_for

pytestmark = pytest.mark.server

ACME = TENANTS[0]


def test_a_body_the_schema_refuses_is_one_warning_line_in_the_server_log(server) -> None:
    assert server.log is not None
    start = len(server.log.read_bytes())  # the server is shared: only this test's lines

    def lines() -> list[str]:
        return server.log.read_bytes()[start:].decode(errors="replace").splitlines()

    def refused() -> list[str]:
        return [line for line in lines() if "refused as the caller's error" in line]

    with client(server, ACME.key) as http:
        response = http.post("/privatize", json={"epsilon": 1.0, "documents": [{"text": "A."}]})
    assert response.status_code == 400
    wait_for(lambda: bool(refused()), timeout=10)
    wait_for(lambda: any("(status=400)" in line for line in lines()), timeout=10)
    (line,) = refused()
    assert json.loads(line)["level"] == "warning"  # not BentoML's error: its filter ran first
    # BentoML's lines (its access log, its endpoint wrapper's) are JSON like sentdp's own,
    # and the access line carries the trace id a sentdp event of the request would
    entries = [json.loads(text) for text in lines() if text.strip()]
    (access,) = [e for e in entries if "(status=400)" in e.get("message", "")]
    assert access["logger"] == "bentoml.access"
    assert access["component"].startswith("entry_service:sentdp:")
    assert access["trace_id"] == json.loads(line)["trace_id"]
