"""The service with the worker's test-only faults on: ``bentoml serve
tests.faulty_server:Gateway`` from the repository root. Every process of the server (the
gateway's and the worker's) imports this module first, so each sees the marker; documents
whose first sentence is ``FAULT:before``, ``FAULT:after`` or ``FAULT:close`` fail as
:data:`service.worker.FAULT_MARKER` says. The product's target, ``service.gateway:Gateway``,
has no way to turn them on."""

from __future__ import annotations

import service.worker

service.worker.FAULT_MARKER = "FAULT"

from service.gateway import Gateway  # noqa: E402 (after the marker, by design)

__all__ = ["Gateway"]
