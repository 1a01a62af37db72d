"""BentoML's HTTP metrics with a bounded ``endpoint`` label.

BentoML 1.4's traffic middleware labels its request counters and histograms with the raw
request path, before routing. Every distinct path, even one answered 404 without a key, then
adds about 20 series to each process's memory and to the shared Prometheus folder on disk,
and is echoed by /metrics: an anonymous client could grow both without limit (about 9 KB per
path; 5,000 made-up paths took a gateway from 262 to 591 MB in a hostile review) and could
write a chosen string into the metrics, and BentoML's access log wrote the path too. Here
any path outside a known set reaches BentoML's middlewares (metrics, tracing, access log) as
:data:`OTHER`; :func:`real_scope`, called by sentdp's guard (the first middleware of
sentdp's own), gives the routes the real path back, so answers do not change.

The metrics middleware is the outermost one, so sentdp cannot add a middleware in front of
it; the class is replaced in BentoML's module before the server builds its middleware list
(BentoML imports it from there at that moment). ``bentoml`` is pinned, and a test on a real
server checks the labels and the log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

OTHER = "(other)"
"""The ``endpoint`` label of every request whose path is not a known route."""

SYSTEM_ROUTES = frozenset({"/", "/docs.json", "/livez", "/readyz", "/healthz", "/metrics"})
"""BentoML's own routes that keep their label."""

_REAL_PATH = "sentdp.real_path"


def bound_endpoint_labels(routes: Iterable[str]) -> None:
    """Make BentoML's HTTP traffic metrics label any path outside ``routes`` (and BentoML's
    own routes) as :data:`OTHER`. Idempotent; call before the server starts."""
    from bentoml._internal.server.http import instruments

    known = SYSTEM_ROUTES | frozenset(routes)
    original = instruments.RunnerTrafficMetricsMiddleware
    if getattr(original, "sentdp_known_routes", None) is not None:
        base = original.__mro__[1]
    else:
        base = original

    class BoundedTrafficMetrics(base):  # type: ignore[misc,valid-type]
        """BentoML's traffic metrics, labelled by known route or :data:`OTHER`."""

        sentdp_known_routes = known

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            path = scope.get("path") if isinstance(scope, dict) else None
            if isinstance(path, str) and path not in known:
                scope = {**scope, "path": OTHER, _REAL_PATH: path}
            await super().__call__(scope, receive, send)

    instruments.RunnerTrafficMetricsMiddleware = BoundedTrafficMetrics  # type: ignore[misc]


def real_scope(scope: Any) -> Any:
    """The request's scope with its real path, as the routes must see it."""
    if isinstance(scope, dict) and _REAL_PATH in scope:
        real = scope[_REAL_PATH]
        scope = {k: v for k, v in scope.items() if k != _REAL_PATH}
        scope["path"] = real
    return scope
