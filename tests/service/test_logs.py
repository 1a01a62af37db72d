"""The service's log: exception messages redacted; a caller's refused body one warning line,
and nothing else downgraded."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest
from pydantic import BaseModel, ValidationError

from service.logs import RedactExceptionMessages

SECRET = "the-caller-s-private-sentence"
BENTOML = "bentoml._internal.server.http_app"
REQUEST_FAILED = "Exception on %s [%s]"


class PrivatizeRequestIODescriptor(BaseModel):  # the shape of BentoML's input models
    epsilon: float


class PrivatizeResponse(BaseModel):  # one of the service's own models
    epsilon: float


def invalid(model: type[BaseModel]) -> ValidationError:
    with pytest.raises(ValidationError) as refused:
        model.model_validate({"epsilon": SECRET})
    return refused.value


def logged(
    error: BaseException,
    name: str = BENTOML,
    message: str = REQUEST_FAILED,
    args: tuple[str, ...] = ("/privatize", "POST"),
) -> tuple[str, str]:
    """(level, text) of ``error`` logged by logger ``name`` with exc_info."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactExceptionMessages())
    levels: list[str] = []

    class Level(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            levels.append(record.levelname)
            return True

    handler.addFilter(Level())
    log = logging.getLogger(name)
    log.addHandler(handler)
    propagate, log.propagate = log.propagate, False
    try:
        raise error
    except type(error):
        log.error(message, *args, exc_info=sys.exc_info())
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
    return levels[0], stream.getvalue()


def test_a_body_that_fails_the_endpoint_s_input_model_is_one_warning_line() -> None:
    level, text = logged(invalid(PrivatizeRequestIODescriptor))
    assert level == "WARNING"
    assert text.strip().splitlines() == [
        "Exception on /privatize [POST]: refused as the caller's error (ValidationError)"
    ]


def test_a_bentoml_4xx_is_a_warning_and_its_5xx_an_error() -> None:
    from bentoml.exceptions import BadInput, InternalServerError

    assert logged(BadInput(SECRET))[0] == "WARNING"
    level, text = logged(InternalServerError(SECRET))
    assert level == "ERROR"
    assert SECRET not in text


@pytest.mark.parametrize(
    ("error", "name", "message", "args"),
    [
        # a response model that fails: the server's bug, even in BentoML's wrapper
        (invalid(PrivatizeResponse), BENTOML, REQUEST_FAILED, ("/privatize", "POST")),
        # the worker's input model: its caller is the gateway, so a mismatch is a bug
        (
            invalid(PrivatizeRequestIODescriptor),
            BENTOML,
            REQUEST_FAILED,
            ("/worker/privatize", "POST"),
        ),
        # logged by sentdp itself (a worker reply it cannot read, after the charge)
        (
            invalid(PrivatizeRequestIODescriptor),
            "sentdp.service",
            "reading the worker's results failed (request %s)",
            ("r-1",),
        ),
        (RuntimeError(SECRET), BENTOML, REQUEST_FAILED, ("/privatize", "POST")),
    ],
)
def test_every_other_failure_stays_an_error_with_its_stack_and_without_its_message(
    error: BaseException, name: str, message: str, args: tuple[str, ...]
) -> None:
    level, text = logged(error, name, message, args)
    assert level == "ERROR"
    assert 'File "' in text  # the stack, frames only
    assert f"{type(error).__qualname__}: <message redacted>" in text
    assert SECRET not in text


TRACE_ID, SPAN_ID = 0x0123456789ABCDEF0123456789ABCDEF, 0x0FEDCBA987654321


@pytest.fixture
def in_a_bentoml_request(monkeypatch: pytest.MonkeyPatch):
    """A gateway process's component name and a request's trace span, as BentoML sets them."""
    from bentoml._internal.context import server_context
    from bentoml._internal.log import _component_name
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    monkeypatch.setattr(server_context, "service_type", "entry_service")
    monkeypatch.setattr(server_context, "service_name", "sentdp")
    monkeypatch.setattr(server_context, "worker_index", 1)
    _component_name.cache_clear()
    span = NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, False, TraceFlags(1)))
    with trace.use_span(span):
        yield
    _component_name.cache_clear()


@contextlib.contextmanager
def only_through(name: str, *handlers: logging.Handler) -> Iterator[logging.Logger]:
    """Logger ``name``, writing through ``handlers`` alone while the block runs."""
    log = logging.getLogger(name)
    propagate, log.propagate = log.propagate, False
    for handler in handlers:
        log.addHandler(handler)
    try:
        yield log
    finally:
        for handler in handlers:
            log.removeHandler(handler)
        log.propagate = propagate


def traced_handler(stream: io.StringIO) -> logging.Handler:
    """A handler as BentoML's server logging config makes it (its tracing filter, text)."""
    from bentoml._internal.log import DATE_FORMAT, TRACED_LOG_FORMAT, TraceRecordFilter

    handler = logging.StreamHandler(stream)
    handler.addFilter(TraceRecordFilter())
    handler.setFormatter(logging.Formatter(TRACED_LOG_FORMAT, DATE_FORMAT))
    return handler


def test_bentoml_s_own_lines_become_json_and_other_handlers_are_left_alone(
    in_a_bentoml_request: None,
) -> None:
    from service import logs

    bentoml_stream, other_stream = io.StringIO(), io.StringIO()
    other = logging.StreamHandler(other_stream)  # a test runner's, an embedding application's
    other.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    with only_through("bentoml.access", traced_handler(bentoml_stream), other) as log:
        logs.json_for_bentoml()
        logs.json_for_bentoml()  # idempotent
        log.warning("127.0.0.1:5 (scheme=http,method=POST,path=/privatize) (status=400) 1.2ms")
    entry = json.loads(bentoml_stream.getvalue())
    assert entry["level"] == "warning"
    assert entry["logger"] == "bentoml.access"
    assert entry["component"] == "entry_service:sentdp:1"
    assert (entry["trace_id"], entry["span_id"]) == (f"{TRACE_ID:032x}", f"{SPAN_ID:016x}")
    assert entry["message"].endswith("path=/privatize) (status=400) 1.2ms")
    assert other_stream.getvalue().startswith("WARNING 127.0.0.1:5 (scheme=http")


def test_sentdp_s_events_carry_the_trace_ids_of_bentoml_s_access_line(
    in_a_bentoml_request: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from service import logs

    logs.configure()
    logs.log_event("charged_request", status=200)
    (line,) = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert (entry["event"], entry["status"]) == ("charged_request", 200)
    assert entry["component"] == "entry_service:sentdp:1"
    assert (entry["trace_id"], entry["span_id"]) == (f"{TRACE_ID:032x}", f"{SPAN_ID:016x}")


def test_an_exception_on_a_bentoml_handler_is_one_json_line_with_its_stack_not_its_message(
    in_a_bentoml_request: None,
) -> None:
    """As in `bentoml serve`'s own process, where sentdp's configure() never runs."""
    from service import logs

    stream = io.StringIO()
    with only_through("bentoml.serve", traced_handler(stream)) as log:
        logs.json_for_bentoml()
        try:
            raise RuntimeError(SECRET)
        except RuntimeError:
            log.exception("Serve failed")
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert (entry["level"], entry["message"]) == ("error", "Serve failed")
    assert 'File "' in entry["exception"]
    assert entry["exception"].endswith("builtins.RuntimeError: <message redacted>")
    assert SECRET not in line


def test_the_json_formatter_alone_never_writes_an_exception_s_message() -> None:
    from service.logs import JsonFormatter

    try:
        raise ValueError(SECRET)
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert entry["exception"].endswith("builtins.ValueError: <message redacted>")
    assert SECRET not in json.dumps(entry)


def test_bentoml_s_handlers_get_the_refused_body_rule_not_only_the_json_form(
    in_a_bentoml_request: None,
) -> None:
    from service import logs

    stream = io.StringIO()
    with only_through(BENTOML, traced_handler(stream)) as log:
        logs.json_for_bentoml()
        try:
            raise invalid(PrivatizeRequestIODescriptor)
        except ValidationError:
            log.error(REQUEST_FAILED, "/privatize", "POST", exc_info=sys.exc_info())
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["level"] == "warning"
    assert "exception" not in entry
    assert SECRET not in line


def test_a_message_that_cannot_be_formatted_never_prints_its_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from service import logs

    logs.configure()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(RedactExceptionMessages())
    with only_through("sentdp.test.unformatted", handler) as log:
        log.warning("%d sentences", SECRET)  # a wrong argument: getMessage raises
        try:
            raise RuntimeError(SECRET)
        except RuntimeError:
            log.error("%d failed", SECRET, exc_info=True)  # the filter formats it first
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [entry["message"] for entry in lines] == [logs.UNFORMATTED, logs.UNFORMATTED]
    assert lines[1]["exception"].endswith("builtins.RuntimeError: <message redacted>")
    assert SECRET not in stream.getvalue() + capsys.readouterr().err


def test_a_failing_trace_filter_never_loses_an_event(
    in_a_bentoml_request: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bentoml._internal.log import TraceRecordFilter

    from service import logs

    def broken(self: object, record: logging.LogRecord) -> bool:
        raise KeyError("trace_id")

    logs.configure()
    monkeypatch.setattr(TraceRecordFilter, "filter", broken)
    logs.log_event("charged_request", status=200)  # must not raise
    (line,) = capsys.readouterr().err.splitlines()
    assert json.loads(line)["event"] == "charged_request"


def test_uncaught_exceptions_are_logged_with_their_stack_and_without_their_message() -> None:
    """In a process of its own: the hooks are the process's (pytest wraps its own)."""
    import subprocess

    code = (
        "import threading\n"
        "from service import logs\n"
        "logs.configure()\n"
        f"def fail(): raise RuntimeError({SECRET!r})\n"
        "thread = threading.Thread(target=fail, name='dispatcher')\n"
        "thread.start(); thread.join()\n"
        f"raise ValueError({SECRET!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert SECRET not in done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [(e["level"], e["message"]) for e in lines] == [
        ("error", "uncaught exception in thread dispatcher"),
        ("critical", "uncaught exception"),
    ]
    assert lines[0]["exception"].endswith("builtins.RuntimeError: <message redacted>")
    assert lines[1]["exception"].endswith("builtins.ValueError: <message redacted>")
