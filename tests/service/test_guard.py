"""The middleware's pure parts: JSON depth, media types, bearer tokens, and the ASGI flow."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import pytest

from service import guard
from service.errors import UNEXPECTED_FAILURE
from service.guard import (
    GuardMiddleware,
    bearer_token,
    body_error_message,
    is_json,
    json_depth_exceeds,
)
from service.metrics import metric
from service.settings import REQUEST_OVERHEAD_BYTES
from service.tenants import Tenant, TenantRegistry, hash_key
from tests.support import Concurrency

KEY = "sdp_unit_key"
REGISTRY = TenantRegistry(
    [Tenant(id="acme", key_sha256=[hash_key(KEY)], max_epsilon=10, budget=10)]
)


def guarded(app: Any, registry: TenantRegistry = REGISTRY, **options: Any) -> GuardMiddleware:
    """The middleware in front of ``app`` with the tests' limits (64-byte bodies, depth 4,
    1 MiB per tenant), any of them replaced by ``options``."""
    limits: dict[str, Any] = {
        "max_body_bytes": 64,
        "max_json_depth": 4,
        "tenant_inflight_bytes": 1 << 20,
    }
    return GuardMiddleware(app, lambda: registry, **(limits | options))


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
    assert guard.json_depth_by_loop(body, limit) is deeper


def _json_like(rng: random.Random) -> bytes:
    """Brackets, commas and string literals whose text holds brackets, quotes and runs of
    backslashes (escaped as JSON escapes them); sometimes a last string left open."""
    parts = []
    for _ in range(rng.randrange(0, 40)):
        kind = rng.random()
        if kind < 0.5:
            parts.append(rng.choice(["[", "{", "]", "}", ",", " "]))
        else:
            text = "".join(rng.choice('ab[]{}"\\') for _ in range(rng.randrange(0, 8)))
            parts.append(json.dumps(text))
    if rng.random() < 0.2:
        parts.append('"' + "".join(rng.choice("[{\\a") for _ in range(rng.randrange(0, 6))))
    return "".join(parts).encode()


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
def test_the_vectorised_depth_scan_equals_the_byte_loop(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard, "DEPTH_CHUNK", chunk)
    rng = random.Random(chunk)
    deeper = 0
    bodies = 3000 if chunk > 3 else 600  # byte-sized chunks are slow to scan
    for _ in range(bodies):
        body = _json_like(rng)
        for limit in (1, 2, 4):
            expected = guard.json_depth_by_loop(body, limit)
            assert json_depth_exceeds(body, limit) is expected, (body, limit)
            deeper += expected
    assert 0.05 < deeper / (3 * bodies) < 0.95  # both outcomes are exercised
    # a backslash run across chunk boundaries: odd, it escapes the quote after it; even, not
    for run, exceeds in ((13, False), (12, True)):
        body = b'["' + bytes([0x5C]) * run + b'"[[[[[[["]'
        assert json_depth_exceeds(body, 2) is guard.json_depth_by_loop(body, 2) is exceeds


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

    guard = guarded(app, metrics_token=metrics_token)
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
        ([AUTH, (b"content-length", b"9" * 5000)], b"{}", 413, "body_too_large"),  # not a 500
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


def test_large_bodies_are_scanned_one_per_tenant_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = Concurrency()
    most = probe.most
    finished: list[bytes] = []

    def slow_scan(body: bytes, limit: int) -> bool:
        with probe.counting(body[:1]):
            time.sleep(0.2)
            finished.append(body[:2])
        return False

    monkeypatch.setattr(guard, "json_depth_exceeds", slow_scan)
    large = guard.INLINE_SCAN_BYTES

    async def scenario() -> list[bool | None]:
        scans = guard.DepthScans(threads=4, waiting=1)
        bodies = [("a", b"a1"), ("a", b"a2"), ("b", b"b1"), ("a", b"a3")]
        tasks = []
        for tenant, name in bodies:
            tasks.append(asyncio.create_task(scans.exceeds(tenant, name.ljust(large, b" "), 4)))
            await asyncio.sleep(0.01)
        results = await asyncio.gather(*tasks)
        assert scans.turns.in_queue("a") == scans.turns.in_queue("b") == 0  # nothing left
        # a small body is scanned at once, on the loop, even while the tenant is busy
        assert await scans.exceeds("a", b"[[[[[[]]]]]]", 4) is not None
        return list(results)

    results = asyncio.run(scenario())
    assert results == [False, False, False, None]  # a's third body found two of a's waiting
    assert (most[b"a"], most[b"b"]) == (1, 1)
    assert finished.index(b"b1") < finished.index(b"a2")  # b did not queue behind a


def test_a_cancelled_scan_keeps_its_tenants_turn_until_its_thread_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []

    def slow_scan(body: bytes, limit: int) -> bool:
        events.append(f"start {body[:2].decode()}")
        time.sleep(0.3)
        events.append(f"end {body[:2].decode()}")
        return False

    monkeypatch.setattr(guard, "json_depth_exceeds", slow_scan)
    large = guard.INLINE_SCAN_BYTES

    async def scenario() -> None:
        scans = guard.DepthScans(threads=4)
        first = asyncio.create_task(scans.exceeds("a", b"a1".ljust(large), 4))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(scans.exceeds("a", b"a2".ljust(large), 4))
        await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.sleep(0.01)
        first.cancel()  # cancelled again (a cancel scope delivers it more than once)
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await second is False

    asyncio.run(scenario())
    assert events == ["start a1", "end a1", "start a2", "end a2"]


OTHER_KEY = "sdp_unit_key_other"
TWO_TENANTS = TenantRegistry(
    [
        Tenant(id="acme", key_sha256=[hash_key(KEY)], max_epsilon=10, budget=10),
        Tenant(id="zeta", key_sha256=[hash_key(OTHER_KEY)], max_epsilon=10, budget=10),
    ]
)


def test_a_tenants_requests_in_flight_are_bounded_in_bytes_and_given_back() -> None:
    """A request counts its overhead and its body from arrival to response: a tenant past
    its bytes gets 429 with Retry-After (at once when Content-Length says so, else as the
    body streams in), another tenant does not, and every exit gives back exactly what was
    counted: a response, 413, 400, 429 mid-stream, a disconnect, a failing app, empty chunks,
    and cancellation while receiving or inside the app."""
    overhead = REQUEST_OVERHEAD_BYTES
    release = asyncio.Event()
    answered: dict[str, tuple[int, str | None, bool]] = {}
    received: dict[str, int] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        if body.startswith(b'{"hold"'):
            await release.wait()
        if body.startswith(b'{"wait"'):
            await asyncio.Event().wait()  # until cancelled
        if body.startswith(b'{"fail"'):
            raise RuntimeError("the app failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    middleware = guarded(app, TWO_TENANTS, tenant_inflight_bytes=2 * overhead + 100)

    async def call(
        name: str,
        chunks: list[bytes],
        key: str = KEY,
        declared: int | None = None,
        end: str = "body",
    ) -> None:
        messages: list[dict[str, Any]] = [
            {"type": "http.request", "body": c, "more_body": n < len(chunks) - 1}
            for n, c in enumerate(chunks)
        ]
        if end == "disconnect":
            messages[-1] = {"type": "http.disconnect"}
        if end == "stall":  # more promised, never sent
            messages[-1]["more_body"] = True
        sent: list[dict[str, Any]] = []
        received[name] = 0

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(0)
            if not messages:
                await asyncio.Event().wait()  # a client that stops sending
            received[name] += 1
            return messages.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        headers = [(b"authorization", f"Bearer {key}".encode())]
        if declared is not None:
            headers.append((b"content-length", str(declared).encode()))
        scope = {"type": "http", "path": "/privatize", "headers": headers}
        try:
            await middleware(scope, receive, send)
        except RuntimeError:
            answered[name] = (500, None, False)
            return
        if not sent:
            answered[name] = (0, None, False)
            return
        payload = json.loads(sent[1]["body"])
        code = payload["error"]["code"] if "error" in payload else None
        retry = (b"retry-after", b"1") in sent[0]["headers"]
        answered[name] = (sent[0]["status"], code, retry)

    held = b'{"hold": "' + b"x" * 48 + b'"}'  # 60 bytes, held in the app: 40 left for acme

    async def cancelled(name: str, chunks: list[bytes], end: str) -> None:
        task = asyncio.create_task(call(name, chunks, end=end))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def scenario() -> dict[str, int]:
        first = asyncio.create_task(call("held", [held], declared=len(held)))
        await asyncio.sleep(0.05)
        holding = {"acme": overhead + 60}
        assert middleware.bodies._inflight == holding
        busy = metric("busy").labels("acme")
        refused_before = busy._value.get()
        await call("over", [b'{"a": "' + b"y" * 20, b'"}', b" " * 20])  # 49 bytes, streamed
        await call("declared over", [b"{}"], declared=41)
        await call("longer than declared", [b'{"a": "' + b"y" * 20, b'"}', b" " * 20], declared=10)
        assert busy._value.get() == refused_before + 3  # each refusal counted
        await call("zeta", [b'{"a": "' + b"z" * 40 + b'"}'], key=OTHER_KEY)
        await call("small", [b'{"a": "' + b"s" * 20 + b'"}'])  # 30 bytes: fits
        await call("empty chunks", [b"", b'{"a": 1}', b""])
        await call("too large", [b" " * 30, b" " * 40])
        await call("too deep", [b"[[[[[[]]]]]]"])
        await call("gone", [b'{"a": 1', b"}"], end="disconnect")
        await call("fails", [b'{"fail": 1}'])
        await cancelled("cancelled receiving", [b'{"a": 1'], end="stall")
        await cancelled("cancelled in the app", [b'{"wait": 1}'], end="body")
        assert middleware.bodies._inflight == holding
        release.set()
        await first
        return dict(middleware.bodies._inflight)

    assert asyncio.run(scenario()) == {}

    def limited(limit: int) -> GuardMiddleware:
        return guarded(app, tenant_inflight_bytes=limit)

    assert limited(64 + overhead).bodies.limit == 64 + overhead
    with pytest.raises(ValueError, match="must admit the largest body"):
        limited(64 + overhead - 1)
    assert received["declared over"] == 0  # refused before any of the body was read
    assert answered == {
        "over": (429, "tenant_busy", True),
        "declared over": (429, "tenant_busy", True),
        "longer than declared": (429, "tenant_busy", True),
        "zeta": (200, None, False),
        "small": (200, None, False),
        "empty chunks": (200, None, False),
        "too large": (413, "body_too_large", False),
        "too deep": (400, "invalid_body", False),
        "gone": (0, None, False),
        "fails": (500, None, False),
        "held": (200, None, False),
    }


def test_a_body_that_arrives_too_slowly_gets_408_and_its_bytes_back() -> None:
    """A client that sends part of a body and stalls is answered 408 ``body_timeout`` after
    ``body_timeout`` seconds, before the app sees anything, and its bytes are given back."""
    reached: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)

    middleware = guarded(app, body_timeout=0.2)
    messages = [{"type": "http.request", "body": b'{"a": ', "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the rest never comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/privatize", "headers": [AUTH]}
    started = time.monotonic()
    asyncio.run(middleware(scope, receive, send))
    assert 0.15 < time.monotonic() - started < 5
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]  # the rest of the body is not read
    assert json.loads(sent[1]["body"])["error"]["code"] == "body_timeout"
    assert reached == []
    assert middleware.bodies._inflight == {}


def test_a_refusal_sent_slowly_is_not_cut_short_by_the_body_timeout() -> None:
    """Only reading the body is timed: a 413 whose sending outlasts ``body_timeout`` (a
    client that does not read) goes out whole, never followed by a second response."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app must not be reached")

    middleware = guarded(app, body_timeout=0.1)
    messages = [{"type": "http.request", "body": b" " * 65, "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        await asyncio.sleep(0.15)  # a full socket buffer
        sent.append(message)

    scope = {"type": "http", "path": "/privatize", "headers": [AUTH]}
    asyncio.run(middleware(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 413
    assert middleware.bodies._inflight == {}


def test_a_body_error_names_no_internal_class() -> None:
    message = "1 validation error for PrivatizeRequestIODescriptor\nuser\n  too short"
    assert (
        body_error_message(message) == "1 validation error in the request body\nuser\n  too short"
    )
    assert body_error_message("Invalid JSON") == "Invalid JSON"
    assert body_error_message("3 validation error for BudgetRequestIODescriptor") == (
        "3 validation errors in the request body"
    )


def answered(
    status: int,
    body: bytes | list[bytes] | None,
    path: str,
    method: str = "GET",
    headers: tuple = (),
) -> tuple[dict[str, Any], bytes, list[dict[str, Any]]]:
    """(start, whole body, every message) the client gets when the app behind the guard
    answers ``status`` with ``body`` (as BentoML's router answers a route it does not have):
    one chunk, several chunks (a list) or no body message at all (None)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        chunks = [body] if isinstance(body, bytes) else body or []
        size = str(sum(len(c) for c in chunks)).encode()
        start = [(b"content-type", b"text/plain"), (b"content-length", size)]
        await send({"type": "http.response.start", "status": status, "headers": [*start, *headers]})
        for n, chunk in enumerate(chunks):
            more = n < len(chunks) - 1
            await send({"type": "http.response.body", "body": chunk, "more_body": more})

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method, "headers": [AUTH]}
    asyncio.run(guarded(app)(scope, receive, send))
    assert sent[0]["type"] == "http.response.start"
    return sent[0], b"".join(m.get("body", b"") for m in sent[1:]), sent


@pytest.mark.parametrize(
    ("status", "body", "path", "code"),
    [
        (405, b"Method Not Allowed", "/budget", "method_not_allowed"),  # GET on a POST route
        (404, b"Not Found", "/privatise", "not_found"),  # unprotected: any path
        (404, b'{"detail": "Not Found"}', "/nope", "not_found"),
        (400, b'{"error": "1 validation error for XIODescriptor"}', "/nope", "invalid_body"),
        (500, b"Internal Server Error", "/privatize", "internal_error"),  # the framework's text
    ],
)
def test_the_framework_s_routing_errors_come_in_sentdp_s_shape(
    status: int, body: bytes, path: str, code: str
) -> None:
    extra = ((b"allow", b"POST"), (b"content-encoding", b"gzip"))
    start, sent, _ = answered(status, body, path, headers=extra)
    assert start["status"] == status
    assert json.loads(sent)["error"]["code"] == code
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(sent)).encode()
    assert headers[b"allow"] == b"POST"  # kept
    assert b"content-encoding" not in headers  # the new body is not encoded


def test_what_the_guard_does_not_rewrite_passes_whole_and_in_order() -> None:
    own = json.dumps({"error": {"code": "unknown_model", "message": "m"}}).encode()
    assert answered(404, own, "/classify")[1] == own  # sentdp's own error
    assert answered(405, b"", "/livez", method="HEAD")[1] == b""  # HEAD
    assert answered(405, b"x", "/budget", method="HEAD")[1] == b"x"  # HEAD, protected path
    start, sent, messages = answered(404, [b"Not ", b"Found"], "/nope")  # in two chunks
    assert (start["status"], sent, len(messages)) == (404, b"Not Found", 3)
    start, sent, messages = answered(404, None, "/nope")  # an app that sent no body
    assert (start["status"], sent, len(messages)) == (404, b"", 1)


def test_bentoml_s_own_errors_say_whose_fault_they_are() -> None:
    """A real BentoML app behind the guard: BentoML answers 400 for every pydantic
    ValidationError a handler raises, so only the input model's is the caller's."""
    import bentoml
    from pydantic import BaseModel, Field
    from starlette.testclient import TestClient

    class Answer(BaseModel):
        n: int = Field(ge=0)

    class Question(BaseModel):
        x: int

    @bentoml.service
    class Framework:
        @bentoml.api(input_spec=Question)
        def answer(self, x: int) -> dict[str, int]:
            return Answer(n=x).model_dump()  # x < 0: the server's own model fails

        @bentoml.api(input_spec=Question)
        def failing(self, x: int) -> dict[str, int]:
            raise RuntimeError("internal detail")

    with TestClient(guarded(Framework.to_asgi(), max_body_bytes=1024)) as http:
        assert http.post("/answer", json={"x": 1}).json() == {"n": 1}
        index = http.get("/")  # BentoML's page there loads Google Tag Manager
        head = http.head("/")
        refused = http.post("/answer", json={"x": "one"})
        broken = http.post("/answer", json={"x": -1})
        failed = http.post("/failing", json={"x": 1})
    assert index.json()["openapi"] == "/docs.json"  # the guard's page, no third-party tag
    assert "googletagmanager" not in index.text
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == str(len(index.content))
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_body"
    assert refused.json()["error"]["detail"][0]["loc"] == ["x"]
    assert "url" not in refused.json()["error"]["detail"][0]  # it names pydantic's version
    for response in (broken, failed):
        assert response.status_code == 500
        assert response.json() == {
            "error": {"code": "internal_error", "message": UNEXPECTED_FAILURE}
        }
        assert response.headers["content-length"] == str(len(response.content))


@pytest.mark.parametrize(
    ("message", "internal"),
    [
        ("1 validation error for PrivatizeRequestIODescriptor", False),
        ("3 validation errors for BudgetRequestIODescriptor", False),
        ("1 validation error for Budget", True),
        ("2 validation errors for WorkReply", True),
        ("Invalid JSON", False),  # BentoML's BadInput: the caller's
    ],
)
def test_only_the_input_model_s_validation_errors_are_the_caller_s(
    message: str, internal: bool
) -> None:
    assert guard.not_the_input_model(message) is internal
