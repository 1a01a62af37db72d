"""sentdp-audit's command line: a deployment that refuses or cannot be reached ends the audit
with a message and exit status 2, never a traceback."""

from __future__ import annotations

import httpx
import pytest
from rich.console import Console

from evaluation.audit import tenant_accounting
from evaluation.audit_cli import _http_errors


def test_an_unreachable_deployment_is_a_message_and_status_2() -> None:
    console = Console(record=True, width=200)
    with (
        pytest.raises(SystemExit) as exited,
        _http_errors(console, "http://127.0.0.1:9", "/budget"),
    ):
        tenant_accounting("http://127.0.0.1:9", "sdp_no_key")  # nothing listens on port 9
    assert exited.value.code == 2
    assert "sentdp-audit: cannot reach http://127.0.0.1:9" in console.export_text()


def test_a_refusal_names_what_was_refused() -> None:
    console = Console(record=True, width=200)
    request = httpx.Request("POST", "http://x/budget")
    body = {"error": {"code": "unauthorized", "message": "unknown key"}}
    refused = httpx.Response(401, json=body, request=request)
    with pytest.raises(SystemExit) as exited, _http_errors(console, "http://x", "/budget"):
        refused.raise_for_status()
    assert exited.value.code == 2
    assert "refused /budget: HTTP 401 unauthorized: unknown key" in console.export_text()
