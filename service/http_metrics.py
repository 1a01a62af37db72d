"""BentoML's HTTP metrics and access log with a bounded path.

BentoML 1.4's traffic middleware labels its request counters and histograms with the raw
request path, before routing. Every distinct path, even one answered 404 without a key, then
adds about 20 series to each process's memory and to the shared Prometheus folder on disk,
and is echoed by /metrics: an anonymous client could grow both without limit (about 9 KB per
path; 5,000 made-up paths took a gateway from 262 to 591 MB in a hostile review) and could
write a chosen string into the metrics. BentoML's access log wrote every path too. Here both
middlewares see any path outside a known set as :data:`OTHER`; the application inside each
still gets the real path, so routing and answers do not change.

Both middlewares are BentoML's own, placed before any middleware sentdp can add, so their
classes are replaced in BentoML's modules before the server builds its middleware list
(BentoML imports them from there at that moment). ``bentoml`` is pinned, and a test on a real
server checks the labels and the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

OTHER = "(other)"
"""The path BentoML's metrics and access log give every request no known route serves."""

SYSTEM_ROUTES = frozenset(
    {"/", "/docs.json", "/schema.json", "/livez", "/readyz", "/healthz", "/metrics"}
)
"""BentoML's own routes, which keep their path."""

_REAL_PATH = "sentdp.real_path"
"""Where a rewritten scope keeps the real path for the app inside."""


def bound_paths(routes: Iterable[str]) -> None:
    """Make BentoML's HTTP traffic metrics and access log see any path outside ``routes``
    (and BentoML's own routes) as :data:`OTHER`. Idempotent; call before the server starts."""
    from bentoml._internal.server.http import access, instruments

    known = SYSTEM_ROUTES | frozenset(routes)
    instruments.RunnerTrafficMetricsMiddleware = _bounded(  # type: ignore[misc,assignment]
        instruments.RunnerTrafficMetricsMiddleware, known
    )
    access.AccessLogMiddleware = _bounded(access.AccessLogMiddleware, known)  # type: ignore[misc,assignment]


def _bounded(middleware: type, known: frozenset[str]) -> type:
    """``middleware`` seeing :data:`OTHER` for unknown paths, its app the real path."""
    base = getattr(middleware, "sentdp_original", middleware)

    class Bounded(base):  # type: ignore[misc,valid-type]
        sentdp_original = base

        def __init__(self, app: Any, *args: Any, **options: Any) -> None:
            super().__init__(_with_real_path(app), *args, **options)

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            path = scope.get("path") if isinstance(scope, dict) else None
            if isinstance(path, str) and path not in known:
                scope = {**scope, "path": OTHER, _REAL_PATH: path}
            await super().__call__(scope, receive, send)

    Bounded.__name__ = Bounded.__qualname__ = base.__name__
    return Bounded


def _with_real_path(app: Any) -> Any:
    """An ASGI app that hands ``app`` the request's real path back."""

    async def restored(scope: Any, receive: Any, send: Any) -> None:
        if isinstance(scope, dict) and _REAL_PATH in scope:
            real = scope[_REAL_PATH]
            scope = {k: v for k, v in scope.items() if k != _REAL_PATH}
            scope["path"] = real
        await app(scope, receive, send)

    return restored
