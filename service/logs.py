"""The service's structured log: one JSON object per line on stderr, never request text.

Events carry ids, counts, codes and timings only (request id, tenant, endpoint, status,
seconds). User ids, documents, sentences, embeddings and candidate ids are never logged: the
log is read by operators, who are outside the trust boundary of the threat model. Logged
exceptions keep their type and stack but lose their messages, on every handler of the
process, since third-party messages quote request data.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from typing import Any

from service.errors import is_input_model

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
            entry["message"] = getattr(record, "sentdp_message", None) or record.getMessage()
        exception = getattr(record, "sentdp_exception", None)
        if exception is not None:
            entry["exception"] = exception
        return json.dumps(entry, default=str)


class RedactExceptionMessages(logging.Filter):
    """Keep a logged exception's type and stack, drop its message and its chain's messages.

    Third-party exceptions carry request data in their messages: BentoML logs every pydantic
    ``ValidationError`` of a request body with its ``input_value`` (fragments of the document).
    Frames name only files, lines and functions, so they stay.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            message = record.getMessage()
            if is_refused_request(record):
                # BentoML logs a body that fails validation as an error with its stack; it
                # is the caller's mistake, answered 4xx: one warning line, no stack
                kind = type(record.exc_info[1]).__qualname__
                record.levelno, record.levelname = logging.WARNING, "WARNING"
                if hasattr(record, "levelname_bracketed"):  # set by BentoML's filter before us
                    record.levelname_bracketed = "[WARNING]"
                message = f"{message}: refused as the caller's error ({kind})"
                text = message
            else:
                stack = redacted_traceback(record.exc_info[1])
                record.sentdp_exception = stack
                text = f"{message}\n{stack}"
            record.sentdp_message = message
            record.msg, record.args = text, ()
            record.exc_info = None
            record.exc_text = None
        return True


BENTOML_REQUEST_FAILED = ("bentoml._internal.server.http_app", "Exception on %s [%s]")
"""The logger and message with which BentoML logs every request its endpoint wrapper failed."""


def is_refused_request(record: logging.LogRecord) -> bool:
    """A record of BentoML's endpoint wrapper for a public request refused as the caller's
    error: its body failed validation against the endpoint's input model (whose pydantic
    title ends in ``IODescriptor``) or BentoML raised a 4xx. Any other ValidationError (a
    response model, a worker's reply, the tenants file), anything logged by sentdp itself,
    and anything on the worker's internal routes (its caller is the gateway) stays an error
    with its stack."""
    from pydantic import ValidationError

    if (record.name, record.msg) != BENTOML_REQUEST_FAILED or not record.exc_info:
        return False
    path = record.args[0] if isinstance(record.args, tuple) and record.args else None
    if not isinstance(path, str) or path.startswith("/worker/"):
        return False
    error = record.exc_info[1]
    if isinstance(error, ValidationError):
        return is_input_model(error.title)
    status = getattr(getattr(error, "error_code", None), "value", None)
    return isinstance(status, int) and 400 <= status < 500


def redacted_traceback(error: BaseException) -> str:
    """The stack of ``error`` and of the exceptions it was raised from, without messages."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current)
        stack = "".join(traceback.format_tb(current.__traceback__))
        parts.append(f"{stack}{kind.__module__}.{kind.__qualname__}: <message redacted>")
        current = current.__cause__ or current.__context__
    return "\nwhich was raised while handling:\n".join(parts)


_REDACT = RedactExceptionMessages()


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(level: int = logging.INFO) -> None:
    """Give the service's logger its JSON handler, and redact exception messages on every
    handler configured so far (BentoML's, uvicorn's, the root's). Idempotent."""
    handlers = list(logging.getLogger().handlers)
    for named in list(logging.root.manager.loggerDict.values()):
        if isinstance(named, logging.Logger):
            handlers.extend(named.handlers)
    for handler in handlers:
        if _REDACT not in handler.filters:
            handler.addFilter(_REDACT)
    if any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        return
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_REDACT)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured event; ``fields`` must hold no request text."""
    logger.log(level, event, extra={"sentdp_fields": {"event": event, **fields}})
