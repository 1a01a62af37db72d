"""The middleware's pure parts: JSON depth, media types, bearer tokens, and the ASGI flow."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from service.guard import GuardMiddleware, bearer_token, is_json, json_depth_exceeds
from service.tenants import Tenant, TenantRegistry, hash_key

KEY = "sdp_unit_key"
REGISTRY = TenantRegistry(
    [Tenant(id="acme", key_sha256=[hash_key(KEY)], max_epsilon=10, budget=10)]
)


@pytest.mark.parametrize(
    ("body", "limit", "deeper"),
    [
        (b"[[[]]]", 3, False),
        (b"[[[[]]]]", 3, True),
        (b'{"a": "[[[[[[[["}', 2, False),  # brackets inside strings do not count
        (b'{"a": "\\"[[[[[[["}', 2, False),  # nor after an escaped quote
        (b'[{"a": [1]}]', 3, False),
    ],
)
def test_json_depth_is_counted_outside_strings(body: bytes, limit: int, deeper: bool) -> None:
    assert json_depth_exceeds(body, limit) is deeper


def test_media_types_and_bearer_tokens() -> None:
    assert is_json(b"application/json; charset=utf-8")
    assert is_json(b"")
    assert not is_json(b"multipart/form-data; boundary=x")
    assert bearer_token({"headers": [(b"authorization", b"Bearer  abc ")]}) == "abc"
    assert bearer_token({"headers": [(b"authorization", b"Basic abc")]}) is None
    assert bearer_token({"headers": []}) is None


def call(
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    path: str = "/privatize",
    metrics_token: str | None = None,
) -> Any:
    """Run the middleware once; return (status, error code or None, tenant seen by the app)."""
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["tenant"] = scope.get("state", {}).get("sentdp_tenant")
        seen["body"] = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = GuardMiddleware(
        app, lambda: REGISTRY, max_body_bytes=64, max_json_depth=4, metrics_token=metrics_token
    )
    scope = {"type": "http", "path": path, "headers": headers}
    asyncio.run(guard(scope, receive, send))
    status = sent[0]["status"]
    payload = json.loads(sent[1]["body"])
    code = payload["error"]["code"] if "error" in payload else None
    return status, code, seen


AUTH = (b"authorization", f"Bearer {KEY}".encode())


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ([], b"{}", 401, "unauthorized"),
        ([(b"authorization", b"Bearer wrong")], b"{}", 401, "unauthorized"),
        ([AUTH, (b"content-type", b"text/plain")], b"{}", 415, "unsupported_media_type"),
        ([AUTH, (b"content-length", b"65")], b"{}", 413, "body_too_large"),
        ([AUTH], b"[" * 65, 413, "body_too_large"),
        ([AUTH], b"[[[[[]]]]]", 400, "invalid_body"),
        ([AUTH], b'{"user": "u"}', 200, None),
    ],
)
def test_the_guard_refuses_before_parsing(
    headers: list[tuple[bytes, bytes]], body: bytes, status: int, code: str | None
) -> None:
    got_status, got_code, seen = call(headers, body)
    assert (got_status, got_code) == (status, code)
    assert ("tenant" in seen) is (status == 200)
    if status == 200:
        assert seen == {"tenant": "acme", "body": body}


def test_unprotected_routes_pass_through_unauthenticated() -> None:
    status, _, seen = call([], b"", path="/readyz")
    assert status == 200
    assert seen["tenant"] is None


@pytest.mark.parametrize(
    ("configured", "sent", "status", "code"),
    [
        (None, None, 403, "metrics_disabled"),
        (None, KEY, 403, "metrics_disabled"),
        ("metrics-token-0123456789", None, 401, "unauthorized"),
        ("metrics-token-0123456789", KEY, 401, "unauthorized"),
        ("metrics-token-0123456789", "metrics-token-0123456789", 200, None),
    ],
)
def test_metrics_need_their_own_token(
    configured: str | None, sent: str | None, status: int, code: str | None
) -> None:
    headers = [(b"authorization", f"Bearer {sent}".encode())] if sent else []
    got_status, got_code, _ = call(headers, b"", path="/metrics", metrics_token=configured)
    assert (got_status, got_code) == (status, code)
