"""The service's log: exception messages redacted; a caller's refused body one warning line,
and nothing else downgraded."""

from __future__ import annotations

import io
import logging
import sys

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
