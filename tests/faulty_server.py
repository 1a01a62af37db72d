"""The service with the worker's test-only faults on: ``bentoml serve
tests.faulty_server:Gateway`` from the repository root. Documents whose first sentence is
``FAULT:before``, ``FAULT:after`` or ``FAULT:close`` fail as
:data:`service.worker.FAULT_MARKER` says. The product's target, ``service.gateway:Gateway``,
has no way to turn them on.

BentoML 1.4.39 starts every process of the server (the gateway's and the worker's) with this
import string and imports it before it finds its service (``_bentoml_impl/worker/service.py``),
so each sees the marker; the fault tests fail if one does not."""

from __future__ import annotations

import service.worker

service.worker.FAULT_MARKER = "FAULT"

from service.gateway import Gateway  # noqa: E402 (after the marker, by design)

__all__ = ["Gateway"]
