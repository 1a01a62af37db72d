"""The service's structured log: one JSON object per line, never request text.

sentdp's own events go to stderr. BentoML's lines (start-up, its access log, the errors its
endpoint wrapper logs) keep BentoML's stream, stdout, in the same JSON form, with BentoML's
component and trace ids as fields, so a log reader parses one format.

Events carry ids, counts, codes and timings only (request id, tenant, endpoint, status,
seconds). User ids, documents, sentences, embeddings and candidate ids are never logged: the
log is read by operators, who are outside the trust boundary of the threat model. Logged
exceptions keep their type and stack but lose their messages, on every handler of the
process, since third-party messages quote request data.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
import time
import traceback
from typing import Any

from service.errors import is_input_model

logger = logging.getLogger("sentdp.service")


UNFORMATTED = "<message could not be formatted>"
"""What a record whose message and arguments do not fit together is logged as: Python's own
fallback would print both, and its arguments may quote request data."""

_TRACE = re.compile(r"trace=([0-9a-fA-F]+),span=([0-9a-fA-F]+)")
"""The ids in the ``trace_msg`` BentoML's tracing filter gives a record."""


def _message(record: logging.LogRecord) -> str:
    """The record's message, or :data:`UNFORMATTED` when formatting it fails (a log call
    must never raise, nor print its arguments)."""
    try:
        return record.getMessage()
    except Exception:
        return UNFORMATTED


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "component", "event"|"message", ...fields, "exception",
    "trace_id", "span_id"}`` per line (``component`` and the ids where BentoML's tracing
    filter set them)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        component = getattr(record, "component", None)
        if isinstance(component, str) and component.strip("[]"):
            entry["component"] = component.strip("[]")
        fields = getattr(record, "sentdp_fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        else:
            entry["message"] = getattr(record, "sentdp_message", None) or _message(record)
        exception = getattr(record, "sentdp_exception", None)
        if exception is None and record.exc_info and record.exc_info[1] is not None:
            exception = redacted_traceback(record.exc_info[1])  # a handler without the filter
        if exception is not None:
            entry["exception"] = exception
        if record.stack_info:  # frames only, as a stack's
            entry["stack"] = record.stack_info
        trace = _TRACE.search(str(getattr(record, "trace_msg", "") or ""))
        if trace is not None:
            entry["trace_id"], entry["span_id"] = trace.groups()
        return json.dumps(entry, default=str)


class RedactExceptionMessages(logging.Filter):
    """Keep a logged exception's type and stack, drop its message and its chain's messages.

    Third-party exceptions carry request data in their messages: BentoML logs every pydantic
    ``ValidationError`` of a request body with its ``input_value`` (fragments of the document).
    Frames name only files, lines and functions, so they stay.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            message = _message(record)
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


def _trace_filter() -> logging.Filter:
    """BentoML's tracing filter (component, trace and span ids), made unable to raise: a
    filter's exception would reach the logging call, and a charged request's event is
    logged after its charge is settled."""
    from bentoml._internal.log import TraceRecordFilter

    class Traced(TraceRecordFilter):
        def filter(self, record: logging.LogRecord) -> bool:
            with contextlib.suppress(Exception):  # the line is worth more than its ids
                super().filter(record)
            return True

    return Traced()


def _handlers() -> list[logging.Handler]:
    """Every handler configured so far: the root's and every named logger's."""
    handlers = list(logging.getLogger().handlers)
    for named in list(logging.root.manager.loggerDict.values()):
        if isinstance(named, logging.Logger):
            handlers.extend(named.handlers)
    return handlers


def json_for_bentoml() -> None:
    """Write BentoML's own lines as JSON: every handler that carries BentoML's tracing filter
    (the handler its server processes and ``bentoml serve`` log through) gets
    :class:`JsonFormatter` and the redaction of exception messages. Other handlers (a test
    runner's, an embedding application's) are left as they are. Idempotent."""
    from bentoml._internal.log import TraceRecordFilter

    logging.raiseExceptions = False  # a failing handler must not print a record's arguments
    for handler in _handlers():
        if not any(isinstance(f, TraceRecordFilter) for f in handler.filters):
            continue
        if _REDACT not in handler.filters:
            handler.addFilter(_REDACT)
        if not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(JsonFormatter())


def _uncaught(kind: type[BaseException], error: BaseException, stack: Any) -> None:
    """``sys.excepthook``: an exception nothing caught, logged with its stack, not its message
    (Python's own hook prints the message)."""
    logger.critical("uncaught exception", exc_info=(kind, error, stack))


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: as :func:`_uncaught`, for a thread (a SystemExit ends it
    quietly, as Python's own hook does)."""
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "?"
    logger.error(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def configure(level: int = logging.INFO) -> None:
    """Give the service's logger its JSON handler, write BentoML's lines as JSON too, redact
    exception messages on every handler configured so far (BentoML's, uvicorn's, the
    root's), and log uncaught exceptions (the process's and its threads') the same way.
    Idempotent."""
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread
    for handler in _handlers():
        if _REDACT not in handler.filters:
            handler.addFilter(_REDACT)
    json_for_bentoml()
    if any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        return
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_trace_filter())  # the component and trace ids BentoML's lines carry
    handler.addFilter(_REDACT)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured event; ``fields`` must hold no request text."""
    logger.log(level, event, extra={"sentdp_fields": {"event": event, **fields}})


def log_failure(event: str, level: int, **fields: Any) -> None:
    """:func:`log_event` with, while an exception is handled, its type (``error``) and stack;
    the handlers drop exception messages, which may hold text."""
    error = sys.exc_info()[1]
    if error is not None:
        fields["error"] = type(error).__name__
    extra = {"sentdp_fields": {"event": event, **fields}}
    logger.log(level, event, exc_info=error is not None, extra=extra)
