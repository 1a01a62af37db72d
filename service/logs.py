"""The service's structured log: one JSON object per line on stderr, never request text.

Events carry ids, counts, codes and timings only (request id, tenant, endpoint, status,
seconds). User ids, documents, sentences, embeddings and candidate ids are never logged: the
log is read by operators, who are outside the trust boundary of the threat model.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

logger = logging.getLogger("sentdp.service")


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "event"|"message", ...fields, "exception"}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "sentdp_fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: int = logging.INFO) -> None:
    """Give the service's logger its own JSON handler (idempotent; BentoML keeps its own)."""
    if any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured event; ``fields`` must hold no request text."""
    logger.log(level, event, extra={"sentdp_fields": {"event": event, **fields}})
