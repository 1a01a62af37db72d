"""Every refusal the service sends: named codes, their HTTP status, and one envelope.

The body of every error is ``{"error": {"code": <code>, "message": <what to fix>, ...}}``;
extra fields (a 402's budget figures, a 503's released documents) sit beside code and message.
A message never holds request text: it names positions, sizes and limits only.
"""

from __future__ import annotations

import json
from enum import StrEnum
from http import HTTPStatus
from typing import Any


class Code(StrEnum):
    """Machine-readable error codes (stable: clients branch on them)."""

    UNAUTHORIZED = "unauthorized"
    METRICS_DISABLED = "metrics_disabled"
    INVALID_BODY = "invalid_body"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    BODY_TOO_LARGE = "body_too_large"
    BODY_TIMEOUT = "body_timeout"
    INVALID_EPSILON = "invalid_epsilon"
    INVALID_DOCUMENT = "invalid_document"
    INVALID_CANDIDATE = "invalid_candidate"
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    DOCUMENT_TOO_LARGE = "document_too_large"
    TOO_MANY_DOCUMENTS = "too_many_documents"
    REQUEST_TOO_LARGE = "request_too_large"
    TENANT_BUSY = "tenant_busy"
    BUDGET_EXHAUSTED = "budget_exhausted"
    UNKNOWN_MODEL = "unknown_model"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    IDEMPOTENCY_KEY_IN_FLIGHT = "idempotency_key_in_flight"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    ACCOUNTANT_CHANGED = "accountant_changed"
    MECHANISM_FAILED = "mechanism_failed"
    INTERNAL_ERROR = "internal_error"
    WORKER_RESPONSE_LOST = "worker_response_lost"
    REPLY_NOT_KEPT = "reply_not_kept"
    WORKER_UNAVAILABLE = "worker_unavailable"
    LEDGER_UNAVAILABLE = "ledger_unavailable"


STATUS: dict[Code, HTTPStatus] = {
    Code.UNAUTHORIZED: HTTPStatus.UNAUTHORIZED,
    Code.METRICS_DISABLED: HTTPStatus.FORBIDDEN,
    Code.INVALID_BODY: HTTPStatus.BAD_REQUEST,
    Code.UNSUPPORTED_MEDIA_TYPE: HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
    Code.BODY_TOO_LARGE: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    Code.BODY_TIMEOUT: HTTPStatus.REQUEST_TIMEOUT,
    Code.INVALID_EPSILON: HTTPStatus.BAD_REQUEST,
    Code.INVALID_DOCUMENT: HTTPStatus.BAD_REQUEST,
    Code.INVALID_CANDIDATE: HTTPStatus.BAD_REQUEST,
    Code.INVALID_IDEMPOTENCY_KEY: HTTPStatus.BAD_REQUEST,
    Code.DOCUMENT_TOO_LARGE: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    Code.TOO_MANY_DOCUMENTS: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    Code.REQUEST_TOO_LARGE: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    Code.TENANT_BUSY: HTTPStatus.TOO_MANY_REQUESTS,
    Code.BUDGET_EXHAUSTED: HTTPStatus.PAYMENT_REQUIRED,
    Code.UNKNOWN_MODEL: HTTPStatus.NOT_FOUND,
    Code.NOT_FOUND: HTTPStatus.NOT_FOUND,
    Code.METHOD_NOT_ALLOWED: HTTPStatus.METHOD_NOT_ALLOWED,
    Code.IDEMPOTENCY_KEY_IN_FLIGHT: HTTPStatus.CONFLICT,
    Code.IDEMPOTENCY_KEY_REUSED: HTTPStatus.UNPROCESSABLE_ENTITY,
    Code.ACCOUNTANT_CHANGED: HTTPStatus.CONFLICT,
    Code.MECHANISM_FAILED: HTTPStatus.INTERNAL_SERVER_ERROR,
    Code.INTERNAL_ERROR: HTTPStatus.INTERNAL_SERVER_ERROR,
    Code.WORKER_RESPONSE_LOST: HTTPStatus.BAD_GATEWAY,
    Code.REPLY_NOT_KEPT: HTTPStatus.GONE,
    Code.WORKER_UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    Code.LEDGER_UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
}
"""The HTTP status of each code: one code, one status, everywhere."""

INPUT_MODEL_SUFFIX = "IODescriptor"
"""BentoML names the pydantic model it builds from an endpoint's ``input_spec``
``<spec>IODescriptor``."""


def is_input_model(title: str) -> bool:
    """A ValidationError of this model (its pydantic title) is a request body failing the
    endpoint's input model, the caller's error; any other is the server's own."""
    return title.endswith(INPUT_MODEL_SUFFIX)


UNEXPECTED_FAILURE = (
    "the service failed while answering (logged); whatever this request charged stands "
    "(see /budget): retry only with the same Idempotency-Key"
)
"""The message of ``internal_error``, a failure the service did not foresee (a bug): it may
come after a reservation, so it never says that nothing was charged."""


def envelope(code: Code, message: str, **details: Any) -> dict[str, Any]:
    """The error body: ``{"error": {"code", "message", **details}}``."""
    return {"error": {"code": code.value, "message": message, **details}}


def error_code(body: str) -> str | None:
    """The code of a serialised error body (a stored reply), or None if it holds none."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


class ApiError(Exception):
    """A refusal: its code (hence its status), what to fix, and optional extra fields."""

    def __init__(
        self, code: Code, message: str, headers: dict[str, str] | None = None, **details: Any
    ) -> None:
        super().__init__(message)
        self.code = code
        self.details = details
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return int(STATUS[self.code])

    def body(self) -> dict[str, Any]:
        return envelope(self.code, str(self), **self.details)

    def json(self) -> str:
        return json.dumps(self.body())


def classify_forms_error() -> ApiError:
    """/classify got a mix of its two forms."""
    return ApiError(
        Code.INVALID_BODY,
        "classify takes either user, epsilon and documents (charged), or model and "
        "candidates (a free lookup), never fields of both",
    )
