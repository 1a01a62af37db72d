"""ASGI middleware in front of the API: authenticate, then bound the body, before any parsing.

* 401 when the ``Authorization: Bearer <key>`` header is missing or names no tenant; the
  tenant id is then put in ``scope["state"]["sentdp_tenant"]`` for the API.
* 415 for a body that is not JSON (BentoML would try to parse it as a multipart form and
  answer a malformed one with a 500).
* 413 when the body is larger than the limit (by Content-Length or as it streams in).
* 408 ``body_timeout`` when the body takes longer than ``body_timeout`` seconds to arrive.
* 429 ``tenant_busy`` when the tenant's requests in this process would pass
  ``tenant_inflight_bytes``: a request counts :data:`~service.settings.REQUEST_OVERHEAD_BYTES`
  plus its body (its Content-Length at once, else its bytes as they stream in) from its
  arrival until its response is sent, so a tenant's queued requests hold a bounded amount of
  memory (beyond it: the bodies of one scan and of up to ``tenant_checks`` checks still
  running after their requests were cancelled).
* 400 when the JSON nests deeper than the limit (a deep body would otherwise exhaust the
  parser's recursion and come back as a 500). Bodies of :data:`INLINE_SCAN_BYTES` or more
  are scanned off the event loop, one at a time per tenant (:class:`DepthScans`), so one
  tenant's large bodies cannot hold up another tenant's requests; 429 ``tenant_busy`` past
  :data:`SCANS_WAITING` of a tenant's bodies waiting.

``/metrics`` needs ``Authorization: Bearer <SENTDP_METRICS_TOKEN>`` (401 otherwise) and is
off (403) while no token is configured. Health and docs routes pass through untouched.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from service.errors import (
    INPUT_MODEL_SUFFIX,
    STATUS,
    UNEXPECTED_FAILURE,
    Code,
    envelope,
    is_input_model,
)
from service.idempotency import caller_secret
from service.metrics import metric
from service.scheduling import TenantChecks, TenantLoad, TurnRefusedError, in_turn
from service.settings import REQUEST_OVERHEAD_BYTES
from service.tenants import TenantRegistry

Refusal = tuple[Code, str, tuple[tuple[bytes, bytes], ...]]
"""An error answer to send: its code, message and extra headers."""
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTECTED_PATHS = frozenset({"/privatize", "/classify", "/budget"})
METRICS_PATH = "/metrics"
INDEX = json.dumps(
    {
        "service": "sentdp",
        "api": {path: "POST" for path in sorted(PROTECTED_PATHS)},
        "openapi": "/docs.json",
        "health": {"/livez": "GET", "/readyz": "GET"},
    }
).encode()
"""What ``GET /`` answers: the framework's own page there loads a third-party tag manager into
the browser of whoever opens it, which a privacy service should not do."""


def json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    """Content-Type and Content-Length of a JSON body."""
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


async def send_error(
    send: Send, code: Code, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    body = json.dumps(envelope(code, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": int(STATUS[code]),
            "headers": [*json_headers(body), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


DEPTH_CHUNK = 1 << 18
"""Bytes of a large body scanned at once by :func:`json_depth_exceeds` (bounds its scratch
memory: a few arrays of this many elements, about 16 MiB)."""


def json_depth_by_loop(body: bytes, limit: int) -> bool:
    """Whether brackets nest deeper than ``limit`` (outside strings), byte by byte: the
    fastest way for a small body (microseconds), and the reference of the vectorised scan."""
    depth = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """:func:`json_depth_by_loop`, vectorised for large bodies: run off the event loop, most
    of it in NumPy without the GIL (measured on 4 MiB bodies: 77-98 ms, between 0.8 and 3.5
    times the byte loop's speed; the loop holds the GIL throughout).

    A quote starts or ends a string unless an odd run of backslashes precedes it. In valid
    JSON backslashes occur only inside strings, where that is the escape rule; elsewhere the
    body is invalid and its parser stops at the first stray backslash, before any bracket
    after it."""
    import numpy as np

    data = np.frombuffer(body, dtype=np.uint8)
    depth, quotes, run = 0, 0, 0  # carried between chunks: level, quotes seen, backslashes
    for start in range(0, len(data), DEPTH_CHUNK):
        part = data[start : start + DEPTH_CHUNK]
        index = np.arange(len(part), dtype=np.int64)
        slash = part == 0x5C
        # the last non-backslash at or before each byte (a chunk's leading run continues the
        # previous chunk's): the length of the backslash run that ends at each byte
        last_other = np.maximum.accumulate(np.where(slash, -1 - run, index))
        runs = index - last_other
        before = np.concatenate(([run], runs[:-1]))
        quote = (part == 0x22) & (before % 2 == 0)
        inside = (quotes + np.cumsum(quote) - quote) % 2 == 1  # after an unmatched quote
        opening = ((part == 0x5B) | (part == 0x7B)) & ~inside
        closing = ((part == 0x5D) | (part == 0x7D)) & ~inside
        levels = depth + np.cumsum(opening.astype(np.int32) - closing.astype(np.int32))
        if int(levels.max()) > limit:
            return True
        depth, quotes, run = int(levels[-1]), quotes + int(quote.sum()), int(runs[-1])
    return False


INLINE_SCAN_BYTES = 16 * 1024
"""Bodies smaller than this are scanned on the event loop, byte by byte (under a
millisecond)."""
SCANS_WAITING = 8
"""A tenant's large bodies waiting for their scan, per gateway process, beyond the one being
scanned; more get 429 (each waiting body is held in memory)."""
SCAN_THREADS = 2
"""Threads scanning large bodies (NumPy releases the GIL for most of a scan)."""


class DepthScans:
    """Scans large bodies on a pool of their own, one body per tenant at a time: a tenant's
    bodies queue behind each other, not in front of other tenants'. A scan holds its tenant's
    turn until its thread is done, however often the request is cancelled meanwhile."""

    def __init__(self, threads: int = SCAN_THREADS, waiting: int = SCANS_WAITING) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="sentdp-json-depth")
        self.turns = TenantChecks(1, waiting)

    async def exceeds(self, tenant: str, body: bytes, limit: int) -> bool | None:
        """:func:`json_depth_exceeds`, or None when the tenant has too many bodies waiting."""
        if len(body) < INLINE_SCAN_BYTES:
            return json_depth_by_loop(body, limit)
        try:
            deeper: bool = await in_turn(
                self.turns, self.pool, tenant, lambda: None, json_depth_exceeds, body, limit
            )
        except TurnRefusedError:
            return None
        return deeper


ROUTING_ERRORS = {
    404: (Code.NOT_FOUND, "no such endpoint; the API is POST /privatize, /classify, /budget"),
    405: (Code.METHOD_NOT_ALLOWED, "this endpoint does not take that method (see Allow)"),
}
"""The routing answers the web framework gives as plain text, and what sentdp says instead."""
HELD = frozenset({400, 404, 405, 500})
"""Statuses whose body :class:`UniformErrors` may rewrite."""
VALIDATION_ERROR = re.compile(r"\d+ validation errors? for (\w+)")
INTERNAL_BODY = json.dumps(envelope(Code.INTERNAL_ERROR, UNEXPECTED_FAILURE)).encode()
"""What a 500 of the framework's becomes."""


class UniformErrors:
    """A ``send`` that rewrites the web framework's own error bodies into sentdp's shape
    ``{"error": {"code": ..., "message": ...}}``: BentoML's 400 (``{"error": str, "detail":
    [...]}``) becomes ``invalid_body``, a plain-text 404 or 405 ``not_found`` or
    ``method_not_allowed``, and any 500 of the framework's ``internal_error``. BentoML
    answers 400 for any pydantic ValidationError a handler raises; one that is not the
    endpoint's input model (whose title ends in ``IODescriptor``) is the server's fault, so
    it becomes a 500 ``internal_error`` too, without the model's field list. sentdp's own
    errors (already in that shape) pass unchanged.

    The start of a 400, 404, 405 or 500 is held until its body comes; anything else that
    comes first, or the app's end without a body (:meth:`flush`), sends it as it was."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.held: Message | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] in HELD:
            self.held = message
            return
        start, self.held = self.held, None
        if start is None:
            await self.send(message)
            return
        body = message.get("body", b"")
        rewritten = (
            _uniform_body(start["status"], body)
            if message["type"] == "http.response.body" and not message.get("more_body")
            else None
        )
        if rewritten is not None:
            status, new_body = rewritten
            kept = [
                (k, v)
                for k, v in start["headers"]
                if k.lower() not in (b"content-length", b"content-type", b"content-encoding")
            ]
            start = {**start, "status": status, "headers": [*kept, *json_headers(new_body)]}
            message = {**message, "body": new_body}
        await self.send(start)
        await self.send(message)

    async def flush(self) -> None:
        """Send a start still held (an app that ended without a body)."""
        start, self.held = self.held, None
        if start is not None:
            await self.send(start)


def _uniform_body(status: int, body: bytes) -> tuple[int, bytes] | None:
    """The status and body in sentdp's error shape, or None when the body already is in it
    (or is not an error the framework made)."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return None  # sentdp's own
    if status == 500:  # BentoML's JSON, or the web framework's plain text
        return 500, INTERNAL_BODY
    if status == 400:
        if not (isinstance(data, dict) and isinstance(data.get("error"), str)):
            return None
        if not_the_input_model(data["error"]):
            return 500, INTERNAL_BODY
        extra = {"detail": _without_urls(data["detail"])} if "detail" in data else {}
        message = body_error_message(data["error"])
        return status, json.dumps(envelope(Code.INVALID_BODY, message, **extra)).encode()
    code, message = ROUTING_ERRORS[status]
    return status, json.dumps(envelope(code, message)).encode()


def not_the_input_model(message: str) -> bool:
    """BentoML's 400 message names a pydantic model other than the endpoint's input model:
    a ValidationError raised while answering, not while reading the body."""
    found = VALIDATION_ERROR.match(message)
    return found is not None and not is_input_model(found.group(1))


def body_error_message(message: str) -> str:
    """BentoML's message for a body that fails validation, without the name of the class
    BentoML made for the endpoint ("1 validation error for PrivatizeRequestIODescriptor"),
    and in the plural where there are several ("3 validation error for ...")."""
    message = re.sub(rf"\bfor \w*{INPUT_MODEL_SUFFIX}\b", "in the request body", message)
    return re.sub(r"^(\d+) validation error\b", _errors_counted, message)


def _errors_counted(found: re.Match[str]) -> str:
    count = int(found.group(1))
    return f"{count} validation error{'' if count == 1 else 's'}"


UNKNOWN_FIELD = "(unknown field)"
"""What an error's ``loc`` says in place of a field name the caller made up."""


def _without_urls(detail: Any) -> Any:
    """pydantic's error list without each entry's ``url`` (a link to its documentation,
    which names the library's version), and without the names of unknown fields: those are
    the caller's text (a document's words sent as a key), and ``loc`` would echo them."""
    if not isinstance(detail, list):
        return detail
    return [_entry_for_caller(entry) if isinstance(entry, dict) else entry for entry in detail]


def _entry_for_caller(entry: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in entry.items() if k != "url"}
    loc = kept.get("loc")
    if kept.get("type") == "extra_forbidden" and isinstance(loc, list) and loc:
        kept["loc"] = [*loc[:-1], UNKNOWN_FIELD]
    return kept


def declared_length(digits: bytes) -> int:
    """A Content-Length's digits as a number; more digits than any real body has count as
    too many to parse (``int`` refuses over 4,300 digits)."""
    return int(digits) if len(digits) <= 19 else 1 << 63


def is_json(content_type: bytes) -> bool:
    """``application/json``, with or without parameters such as a charset."""
    media = content_type.decode("latin-1").split(";", 1)[0].strip().lower()
    return media in {"application/json", ""}


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return str(token.strip())
    return None


class GuardMiddleware:
    """Authenticate and bound requests to the protected routes."""

    def __init__(
        self,
        app: ASGIApp,
        registry_loader: Callable[[], TenantRegistry],
        max_body_bytes: int,
        max_json_depth: int,
        tenant_inflight_bytes: int,
        metrics_token: str | None = None,
        body_timeout: float = 30.0,
    ) -> None:
        if tenant_inflight_bytes < max_body_bytes + REQUEST_OVERHEAD_BYTES:
            raise ValueError("a tenant's bytes in flight must admit the largest body")
        self.app = app
        self.metrics_token = metrics_token
        self._loader = registry_loader
        self.max_body_bytes = max_body_bytes
        self.bodies = TenantLoad(tenant_inflight_bytes, requests=None)
        self.body_timeout = body_timeout
        self.max_json_depth = max_json_depth
        self.scans = DepthScans()

    @property
    def registry(self) -> TenantRegistry:
        """The current tenants (the loader re-reads a changed tenants file)."""
        return self._loader()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == METRICS_PATH:
            refusal = self._metrics_refusal(bearer_token(scope))
            if refusal is not None:
                await send_error(send, *refusal)
                return
        if scope["type"] != "http" or scope.get("path") not in PROTECTED_PATHS:
            if scope["type"] != "http":
                await self.app(scope, receive, send)
            else:
                await self._uniform(scope, receive, send)
            return
        token = bearer_token(scope)
        tenant = self.registry.authenticate(token)
        refusal = self._refusal(tenant is not None, scope.get("headers", []))
        if refusal is not None or tenant is None:
            await send_error(send, *(refusal or (Code.UNAUTHORIZED, "invalid API key")))
            return
        counted = [0]  # bytes counted against the tenant for this request, given back at the end
        try:
            if not self._count(tenant.id, counted, self._declared(scope.get("headers", []))):
                await send_error(send, *self._busy(tenant.id))
                return
            body = await self._received_in_time(tenant.id, receive, send, counted)
            if body is None:
                return
            refused = await self._depth_refusal(tenant.id, body)
            if refused is not None:
                await send_error(send, *refused)
                return
            state = scope.setdefault("state", {})
            state["sentdp_tenant"] = tenant.id
            assert token is not None  # authenticate() found a tenant for it
            state["sentdp_caller"] = caller_secret(token)
            delivered = False

            async def replay() -> Message:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self._uniform(scope, replay, send)
        finally:
            if counted[0]:
                self.bodies.release(tenant.id, counted[0])

    async def _uniform(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, its framework's error bodies in sentdp's shape (:class:`UniformErrors`;
        not for HEAD, whose answers have no body); ``/`` answers :data:`INDEX` itself."""
        if scope.get("path") == "/" and scope.get("method") in ("GET", "HEAD"):
            start = {"type": "http.response.start", "status": 200, "headers": json_headers(INDEX)}
            await send(start)
            body = b"" if scope["method"] == "HEAD" else INDEX
            await send({"type": "http.response.body", "body": body})
            return
        if scope.get("method") == "HEAD":
            await self.app(scope, receive, send)
            return
        uniform = UniformErrors(send)
        await self.app(scope, receive, uniform)
        await uniform.flush()

    @staticmethod
    def _declared(headers: list[tuple[bytes, bytes]]) -> int:
        """The body's Content-Length (already checked against the limit), else 0."""
        for name, value in headers:
            if name == b"content-length" and value.isdigit():
                return declared_length(value)
        return 0

    def _count(self, tenant: str, counted: list[int], body_bytes: int) -> bool:
        """Count the request at ``REQUEST_OVERHEAD_BYTES`` plus ``body_bytes`` against the
        tenant (only what ``counted[0]`` does not hold yet); False when that would pass the
        limit."""
        more = REQUEST_OVERHEAD_BYTES + body_bytes - counted[0]
        if more <= 0:
            return True
        if not self.bodies.try_acquire(tenant, more):
            return False
        counted[0] += more
        return True

    def _busy(self, tenant: str) -> Refusal:
        """The 429 for a tenant past its bytes in flight (counted as every tenant_busy)."""
        metric("busy").labels(tenant).inc()
        busy = (
            f"this tenant's requests in flight would pass {self.bodies.limit} bytes; "
            "retry after one ends"
        )
        return Code.TENANT_BUSY, busy, ((b"retry-after", b"1"),)

    async def _received_in_time(
        self, tenant: str, receive: Receive, send: Send, counted: list[int]
    ) -> bytes | None:
        """:meth:`_received` within ``body_timeout`` (else 408, closing the connection);
        None when the request was answered or is gone. Only the reading is timed, never the
        sending of a refusal."""
        try:
            async with asyncio.timeout(self.body_timeout):
                received = await self._received(tenant, receive, counted)
        except TimeoutError:
            late = f"the request body did not arrive within {self.body_timeout:g} s"
            await send_error(send, Code.BODY_TIMEOUT, late, ((b"connection", b"close"),))
            return None
        if isinstance(received, tuple):
            await send_error(send, *received)
            return None
        return received

    async def _received(
        self, tenant: str, receive: Receive, counted: list[int]
    ) -> bytes | Refusal | None:
        """The whole body, its bytes beyond what was counted (the Content-Length) counted as
        they arrive; a refusal (413, 429) to send, or None when the client is gone."""
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return Code.BODY_TOO_LARGE, self._too_large(), ()
            if not self._count(tenant, counted, size):
                return self._busy(tenant)
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        return b"".join(chunks)

    async def _depth_refusal(self, tenant: str, body: bytes) -> Refusal | None:
        """Why to refuse a body for its JSON depth (or the tenant's bodies waiting), if at all."""
        deeper = await self.scans.exceeds(tenant, body, self.max_json_depth)
        if deeper is None:  # as every tenant_busy: counted, and Retry-After
            metric("busy").labels(tenant).inc()
            busy = "too many of this API key's large requests are waiting; retry after one ends"
            return Code.TENANT_BUSY, busy, ((b"retry-after", b"1"),)
        if deeper:
            return Code.INVALID_BODY, f"JSON nested deeper than {self.max_json_depth} levels", ()
        return None

    def _refusal(
        self, authenticated: bool, headers: list[tuple[bytes, bytes]]
    ) -> tuple[Code, str] | None:
        """Why to refuse a request from its headers alone, if at all."""
        if not authenticated:
            return (
                Code.UNAUTHORIZED,
                "missing or invalid API key: send 'Authorization: Bearer <key>'",
            )
        for name, value in headers:
            if (
                name == b"content-length"
                and value.isdigit()
                and declared_length(value) > self.max_body_bytes
            ):
                return Code.BODY_TOO_LARGE, self._too_large()
            if name == b"content-type" and not is_json(value):
                return (
                    Code.UNSUPPORTED_MEDIA_TYPE,
                    "send the request body as JSON (Content-Type: application/json)",
                )
        return None

    def _metrics_refusal(self, token: str | None) -> tuple[Code, str] | None:
        if self.metrics_token is None:
            return Code.METRICS_DISABLED, "metrics are off: set SENTDP_METRICS_TOKEN to serve them"
        if token is None or not hmac.compare_digest(token.encode(), self.metrics_token.encode()):
            return Code.UNAUTHORIZED, "send 'Authorization: Bearer <SENTDP_METRICS_TOKEN>'"
        return None

    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_body_bytes} bytes"
