"""Prometheus metrics beyond BentoML's own, created lazily once per process.

``prometheus_client`` is imported only on first use, after BentoML has set
``PROMETHEUS_MULTIPROC_DIR`` for the worker process, so the values of every worker appear on
``/metrics``. Creating them twice in one process would raise DuplicateTimeseries, hence the
module-level cache.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_metrics: dict[str, Any] = {}

_SPECS: dict[str, tuple[str, str, tuple[str, ...], dict[str, Any]]] = {
    "documents": ("Counter", "sentdp_documents_privatized", ("tenant",), {}),
    "sentences": ("Counter", "sentdp_sentences_privatized", ("tenant",), {}),
    "epsilon": (
        "Histogram",
        "sentdp_epsilon_requested",
        ("tenant",),
        {"buckets": (0.1, 0.5, 1, 3, 6, 10, 23, 50, 100, 1000)},
    ),
    "refusals": ("Counter", "sentdp_budget_refusals", ("tenant",), {}),
    "busy": ("Counter", "sentdp_tenant_busy_refusals", ("tenant",), {}),
    "late_requests": ("Counter", "sentdp_worker_late_requests", (), {}),
    "replays": ("Counter", "sentdp_idempotent_replays", ("tenant",), {}),
    "refunds": ("Counter", "sentdp_refunded_documents", ("reason",), {}),
    "ledger_seconds": (
        "Histogram",
        "sentdp_ledger_seconds",
        ("operation",),
        {"buckets": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)},
    ),
    "request_seconds": (
        "Histogram",
        "sentdp_charged_request_seconds",
        ("endpoint",),
        {"buckets": (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)},
    ),
    "worker_call_seconds": (
        "Histogram",
        "sentdp_worker_call_seconds",
        (),
        {"buckets": (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)},
    ),
    "batch_documents": (
        "Histogram",
        "sentdp_worker_batch_documents",
        (),
        {"buckets": (1, 2, 4, 8, 16, 32, 64)},
    ),
    "batch_sentences": (
        "Histogram",
        "sentdp_worker_batch_sentences",
        (),
        {"buckets": (1, 8, 32, 128, 512, 1024, 2048, 4096, 16384)},
    ),
    "worker_seconds": (
        "Histogram",
        "sentdp_worker_batch_seconds",
        ("stage",),
        {"buckets": (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)},
    ),
}


def metric(name: str) -> Any:
    """The named metric of this process, created on first use."""
    found = _metrics.get(name)
    if found is not None:
        return found
    with _lock:
        if name not in _metrics:
            import prometheus_client

            kind, full_name, labels, options = _SPECS[name]
            cls = getattr(prometheus_client, kind)
            _metrics[name] = cls(full_name, f"sentdp: {full_name}", labels, **options)
        return _metrics[name]


def protect_metrics_folder() -> None:
    """Make the folder of every process's metric values readable by this user alone.

    BentoML creates it with the default umask (0755, files 0644). Its files hold the series
    /metrics answers only with ``SENTDP_METRICS_TOKEN`` (per-tenant counts, the histograms of
    ε and of batch sentences), so another local user could otherwise read them directly. The
    gateway calls this when its module is imported: in ``bentoml serve``'s first process that
    is just after BentoML recreated the folder and before any server process writes a file
    (a file opened before the change would stay readable through its open handle).
    """
    path = metrics_folder()
    if path is not None and path.is_dir() and path.stat().st_uid == os.getuid():
        path.chmod(0o700)


def metrics_folder() -> Path | None:
    """BentoML's folder of every process's metric values (``PROMETHEUS_MULTIPROC_DIR``, else
    ``$BENTOML_HOME/prometheus_multiproc_dir``): shared by every process of one server,
    emptied by ``bentoml serve`` at each launch, and private to the server's user once the
    gateway's module is imported (:func:`protect_metrics_folder`)."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder:
        from bentoml._internal.configuration.containers import BentoMLContainer

        folder = BentoMLContainer.prometheus_multiproc_dir.get()
    return Path(folder) if folder else None
