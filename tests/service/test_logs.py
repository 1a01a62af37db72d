"""The service's log: exception messages redacted, a caller's bad body one warning line."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from pydantic import BaseModel, ValidationError

from service.logs import RedactExceptionMessages

SECRET = "the-caller-s-private-sentence"


class Body(BaseModel):
    epsilon: float


def logged(error: BaseException) -> tuple[str, str]:
    """(level, text) of ``error`` logged as BentoML logs a failed request."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactExceptionMessages())
    log = logging.getLogger("test.bentoml")
    log.addHandler(handler)
    log.propagate = False
    seen: list[str] = []

    class Level(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            seen.append(record.levelname)
            return True

    handler.addFilter(Level())
    try:
        raise error
    except type(error):
        log.error("Exception on %s [%s]", "/privatize", "POST", exc_info=sys.exc_info())
    finally:
        log.removeHandler(handler)
    return seen[0], stream.getvalue()


def test_a_body_that_fails_validation_is_one_warning_line_without_its_input() -> None:
    with pytest.raises(ValidationError) as refused:
        Body.model_validate({"epsilon": SECRET})
    level, text = logged(refused.value)
    assert level == "WARNING"
    assert text.strip().splitlines() == [
        "Exception on /privatize [POST]: refused as the caller's error (ValidationError)"
    ]


def test_a_server_failure_keeps_its_stack_and_loses_its_message() -> None:
    level, text = logged(RuntimeError(SECRET))
    assert level == "ERROR"
    assert "Traceback" not in text  # our own rendering of the stack, frames only
    assert 'File "' in text
    assert "RuntimeError: <message redacted>" in text
    assert SECRET not in text
