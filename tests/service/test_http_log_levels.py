"""The server's own log as an operator reads it: one JSON object per line, BentoML's lines
included, and a body the request schema refuses as one warning."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import TENANTS, client, privatize, wait_for

pytestmark = pytest.mark.server

ACME = TENANTS[0]


def entries(text: str) -> list[dict[str, Any]]:
    """Every complete line of ``text`` as JSON (the server may be writing the last one); a
    line that is not JSON fails with the line in view."""
    parsed = []
    for line in text.split("\n")[:-1]:
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a server log line is not JSON: {line[:300]!r}")
    return parsed


def test_the_start_up_line_of_bentoml_serve_s_own_process_is_json(server) -> None:
    assert server.log is not None
    started = [  # one per launch (a launch that lost its port is retried)
        e
        for e in entries(server.log.read_text(errors="replace"))
        if e.get("message", "").startswith("Starting production HTTP BentoServer")
    ]
    assert started
    assert all((e["level"], e["component"]) == ("info", "cli") for e in started)


def test_a_body_the_schema_refuses_is_one_warning_line_in_the_server_log(server) -> None:
    assert server.log is not None
    start = len(server.log.read_bytes())  # the server is shared: only this test's lines

    def logged() -> list[dict[str, Any]]:
        return entries(server.log.read_bytes()[start:].decode(errors="replace"))

    def refused() -> list[dict[str, Any]]:
        return [e for e in logged() if "refused as the caller's error" in e.get("message", "")]

    with client(server, ACME.key) as http:
        response = http.post("/privatize", json={"epsilon": 1.0, "documents": [{"text": "A."}]})
    assert response.status_code == 400
    wait_for(lambda: bool(refused()), timeout=10)
    wait_for(lambda: any("(status=400)" in e.get("message", "") for e in logged()), timeout=10)
    (line,) = refused()
    assert line["level"] == "warning"  # not BentoML's error: its filter ran first
    (access,) = [e for e in logged() if "(status=400)" in e.get("message", "")]
    assert access["logger"] == "bentoml.access"
    assert access["component"].startswith("entry_service:sentdp:")
    assert access["trace_id"] == line["trace_id"]


def test_a_charged_request_s_event_joins_its_access_line_by_trace_id(server) -> None:
    assert server.log is not None
    start = len(server.log.read_bytes())

    def logged() -> list[dict[str, Any]]:
        return entries(server.log.read_bytes()[start:].decode(errors="replace"))

    def events() -> list[dict[str, Any]]:
        return [e for e in logged() if e.get("event") == "charged_request"]

    def accesses() -> list[dict[str, Any]]:
        return [
            e
            for e in logged()
            if e.get("logger") == "bentoml.access"
            and "path=/privatize) (status=200)" in e.get("message", "")
        ]

    response = privatize(server, "log-join-user", epsilon=0.5)
    assert response.status_code == 200, response.text
    wait_for(lambda: bool(events()) and bool(accesses()), timeout=10)
    (event,) = events()
    (access,) = accesses()
    assert event["status"] == 200
    assert event["component"].startswith("entry_service:sentdp:")
    assert event["trace_id"] == access["trace_id"]
    assert "log-join-user" not in server.log.read_text(errors="replace")  # no user id logged


def test_a_server_that_reports_usage_to_bentoml_says_so_in_its_log(
    server, quick_bundle_tag: str, tmp_path
) -> None:
    """BentoML's server sends its makers request counts by endpoint and status unless
    BENTOML_DO_NOT_TRACK=true (every launcher and image of sentdp sets it): a server started
    without it warns, once per gateway process, and one started with it says nothing."""
    from tests.support import Server, sqlite_server_env

    def warnings(text: str) -> list[dict[str, Any]]:
        return [e for e in entries(text) if e.get("event") == "usage_tracking_on"]

    assert server.log is not None
    assert warnings(server.log.read_text(errors="replace")) == []
    env = sqlite_server_env(
        tmp_path,
        quick_bundle_tag,
        SENTDP_GATEWAY_WORKERS="1",
        BENTOML_DO_NOT_TRACK="false",
        __BENTOML_DEBUG_USAGE="true",  # BentoML then logs its reports instead of sending
    )
    tracked = Server(env, log=tmp_path / "server.log").start()
    try:
        (warning,) = warnings(tracked.log.read_text(errors="replace"))  # type: ignore[union-attr]
        assert warning["level"] == "warning"
        assert "BENTOML_DO_NOT_TRACK=true" in warning["reason"]
    finally:
        tracked.stop()
