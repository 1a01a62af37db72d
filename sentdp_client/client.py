"""A small typed client for sentdp's HTTP API, for product backends.

Every charged call carries an ``Idempotency-Key``, the same one on every retry, so a retry
never spends the user's budget twice: the server replays a finished request's stored answer,
answers 409 while it is still running, and frees the key when nothing was sampled. Refusals
become exceptions that carry the server's error code, message and extra fields.

Retried (same key, exponential backoff, at least the server's ``Retry-After``): connection
failures and timeouts, 429 (tenant busy: nothing charged, or everything refunded), 408 (the
body arrived too slowly: nothing charged), 409 (the same key still in flight), a 503 that
released nothing (every charge refunded), and a proxy's 502/503/504 without sentdp's error
body. Each is safe under one key: the server
replays a finished request (a failure after sampling included), answers 409 while it runs
and frees the key only when nothing was sampled. Not retried: sentdp's own
500 ``mechanism_failed``, 500 ``internal_error`` (a server bug; on a charged call the charge may
stand, unless the error says ``"charged": false``), 502 ``worker_response_lost``
(replaying them would only return them again; the charge stands), 410 ``reply_not_kept``
(the request ran, but the server kept no copy of its reply for retries: the tenant's bound
on stored replies) and every 4xx that a retry cannot fix. Every exception carries the
request's ``idempotency_key``: retry later with it to get the stored answer (a
``reply_not_kept`` one excepted), never pay twice.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_CODES = frozenset({"tenant_busy", "idempotency_key_in_flight", "body_timeout"})
CHARGE_STANDS = frozenset({"worker_response_lost", "mechanism_failed", "reply_not_kept"})
"""Failures after the mechanism may have run: the charge is final, a retry is a new charge."""


class SentDPError(Exception):
    """A refusal from the server: HTTP status, error code, message and extra fields."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any],
        idempotency_key: str | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.idempotency_key = idempotency_key
        """The key the request was sent with (charged calls): reuse it to retry safely."""


class BudgetExhaustedError(SentDPError):
    """402: the user's remaining budget cannot pay for this request (nothing was charged)."""

    @property
    def remaining(self) -> float | None:
        """What remains of the user's budget, in the tenant's budget units (group epsilon
        under the default accountant: ``group_size`` times epsilon per request)."""
        value = self.details.get("remaining")
        return None if value is None else float(value)

    @property
    def remaining_epsilon(self) -> float | None:
        """The largest epsilon one more release of this user may have (``remaining`` is in
        the tenant's budget units: group epsilon by default, so g times this). Under the
        default accountant a request is admitted when its ``requested`` total is at most
        this."""
        value = self.details.get("remaining_epsilon")
        return None if value is None else float(value)


class AuthenticationError(SentDPError):
    """401: the API key is missing, unknown or revoked."""


class InvalidRequestError(SentDPError):
    """400, 404, 409 (accountant changed), 413 or 422: the request itself must change."""


class UnavailableError(SentDPError):
    """429, 503 or 409 after every retry, or any 5xx: try again later. ``released`` holds the
    documents of a 503 that were sampled (and charged) before the failure."""

    @property
    def released(self) -> list[dict[str, Any]]:
        return list(self.details.get("released") or [])


class OutcomeUnknownError(SentDPError):
    """The documents may have been sampled, so the charge stands: sentdp's 502
    worker_response_lost, 500 mechanism_failed or (on a charged call) 500 internal_error, or a
    proxy's 502/504 after every retry; or
    410 reply_not_kept: the request was served and charged, but the server did not keep its
    reply for retries (the tenant's bound on stored replies), so a retry cannot recover it.
    Retrying with ``idempotency_key`` replays the stored answer at no charge; a new key is a
    new charge."""


@dataclass(frozen=True)
class Document:
    """A document as raw text (the server splits it) or as sentences you split yourself.
    ``document_id`` is required by tenants on per-document accounting."""

    text: str | None = None
    sentences: Sequence[str] | None = None
    document_id: str | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.text is not None:
            out["text"] = self.text
        if self.sentences is not None:
            out["sentences"] = list(self.sentences)
        if self.document_id is not None:
            out["document_id"] = self.document_id
        return out


@dataclass(frozen=True)
class Budget:
    user: str
    spent_epsilon: float
    limit: float
    remaining: float
    remaining_epsilon: float
    group_size: int
    raw: dict[str, Any] = field(repr=False)
    """Every field the server sent (accountant, spend units, period...)."""
    accounting: str = "pure"
    """``pure`` or ``zcdp``: how the tenant counts spend."""
    spend: float = 0.0
    """What the accountant charged so far, in ``spend_unit`` (rho for zCDP tenants)."""
    spend_limit: float = 0.0
    spend_unit: str = "epsilon"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Budget:
        return cls(
            user=data["user"],
            spent_epsilon=float(data["spent_epsilon"]),
            limit=float(data["limit"]),
            remaining=float(data["remaining"]),
            remaining_epsilon=float(data["remaining_epsilon"]),
            group_size=int(data["group_size"]),
            raw=data,
            accounting=str(data.get("accounting", "pure")),
            spend=float(data.get("spend", 0.0)),
            spend_limit=float(data.get("spend_limit", 0.0)),
            spend_unit=str(data.get("spend_unit", "epsilon")),
        )


@dataclass(frozen=True)
class PrivateDocument:
    """One released document. ``embedding`` is None where /classify released only a label
    (``label_mechanism == "sentence-vote"``)."""

    k: int
    epsilon: float
    embedding: list[float] | None = None
    candidate: int | None = None
    label: str | None = None
    label_mechanism: str | None = None
    probabilities: dict[str, float] | None = None
    document_id: str | None = None
    variant: str | None = None
    """The bundle's mechanism variant that drew the candidate."""
    selection: str | None = None
    """How the candidate was drawn: "depth" (Tukey depth over ``p`` directions) or "mean"
    (distance to the document's clipped mean)."""
    p: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PrivateDocument:
        return cls(
            k=int(data["k"]),
            epsilon=float(data["epsilon"]),
            embedding=data.get("embedding"),
            candidate=data.get("candidate"),
            label=data.get("label"),
            label_mechanism=data.get("label_mechanism"),
            probabilities=data.get("probabilities"),
            document_id=data.get("document_id"),
            variant=data.get("variant"),
            selection=data.get("selection"),
            p=data.get("p"),
        )


@dataclass(frozen=True)
class Release:
    """A charged call's answer: the documents, the model that made them, the user's budget
    after the charge, and whether the server replayed a stored answer."""

    model: str
    documents: list[PrivateDocument]
    budget: Budget
    replayed: bool
    idempotency_key: str


DocumentLike = str | Sequence[str] | Document


def _as_document(document: DocumentLike) -> Document:
    if isinstance(document, Document):
        return document
    if isinstance(document, str):
        return Document(text=document)
    return Document(sentences=list(document))


class Client:
    """Synchronous sentdp client. One instance per API key; safe to share between threads.

    ``retries`` is how many times a retryable failure is tried again (with the same key),
    waiting ``backoff`` seconds, doubled each time (capped at 10 s), or the server's
    ``Retry-After`` when that is longer (up to 60 s). ``timeout`` is above the
    server's own request timeout (150 s by default) and a proxy's (180 s in deploy/), so a
    slow answer is waited for rather than retried.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 200.0,
        retries: int = 5,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- the API ---------------------------------------------------------------------------
    def privatize(
        self,
        user: str,
        epsilon: float,
        documents: Sequence[DocumentLike],
        *,
        idempotency_key: str | None = None,
    ) -> Release:
        """One epsilon-SentDP embedding per document, charged to ``user``."""
        return self._charged("/privatize", user, epsilon, documents, idempotency_key)

    def classify(
        self,
        user: str,
        epsilon: float,
        documents: Sequence[DocumentLike],
        *,
        idempotency_key: str | None = None,
    ) -> Release:
        """One private label per document (and the embedding, where the label comes from the
        released candidate), charged to ``user``."""
        return self._charged("/classify", user, epsilon, documents, idempotency_key)

    def labels(self, model: str, candidates: Sequence[int]) -> dict[int, str]:
        """Labels of candidates already released by ``model``: free post-processing."""
        data, _ = self._post("/classify", {"model": model, "candidates": list(candidates)}, None)
        return {int(c["candidate"]): str(c["label"]) for c in data["labels"]}

    def budget(self, user: str) -> Budget:
        """The user's spending in this period and what remains; charges nothing."""
        data, _ = self._post("/budget", {"user": user}, None)
        return Budget.from_json(data)

    # --- transport -------------------------------------------------------------------------
    def _charged(
        self,
        path: str,
        user: str,
        epsilon: float,
        documents: Sequence[DocumentLike],
        key: str | None,
    ) -> Release:
        if isinstance(documents, str | Document):
            raise TypeError("documents is a list: wrap a single document in [ ]")
        key = key or str(uuid.uuid4())
        body = {
            "user": user,
            "epsilon": epsilon,
            "documents": [_as_document(d).body() for d in documents],
        }
        data, response = self._post(path, body, key)
        return Release(
            model=data["model"],
            documents=[PrivateDocument.from_json(d) for d in data["documents"]],
            budget=Budget.from_json(data["budget"]),
            replayed=response.headers.get("idempotent-replayed") == "true",
            idempotency_key=key,
        )

    def _post(
        self, path: str, body: dict[str, Any], key: str | None
    ) -> tuple[dict[str, Any], httpx.Response]:
        headers = {"Idempotency-Key": key} if key else {}
        attempt = 0
        while True:
            asked = 0.0
            try:
                response = self._http.post(path, json=body, headers=headers)
            except httpx.TransportError as failed:
                if attempt >= self.retries:
                    raise _transport_error(failed, key) from failed
            else:
                if response.status_code == 200:
                    return response.json(), response
                error = _error(response, key)
                if attempt >= self.retries or not _retryable(error):
                    raise error
                asked = _retry_after(response)
            time.sleep(max(min(self.backoff * 2**attempt, 10.0), asked))
            attempt += 1


def _transport_error(failed: httpx.TransportError, key: str | None) -> SentDPError:
    """No answer: never sent (nothing charged), or sent and unanswered (outcome unknown)."""
    if isinstance(failed, httpx.ConnectError | httpx.ConnectTimeout):
        return UnavailableError(0, "connection_failed", str(failed), {}, key)
    return OutcomeUnknownError(0, "no_answer", str(failed), {}, key)


MAX_RETRY_AFTER = 60.0
"""The longest ``Retry-After`` the client honours (seconds); a longer one is cut to this."""


def _retry_after(response: httpx.Response) -> float:
    """The seconds a ``Retry-After: <seconds>`` header asks for (0 without one, or with a
    date, which sentdp never sends)."""
    try:
        seconds = float(response.headers.get("retry-after", "0"))
    except ValueError:
        return 0.0
    if math.isnan(seconds):
        return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


PROXY_ERRORS = frozenset({502, 503, 504})
"""Statuses a proxy or load balancer answers without sentdp's error body."""


def _retryable(error: SentDPError) -> bool:
    if error.code in RETRY_CODES:
        return True
    if error.code == "http_error":
        return error.status in PROXY_ERRORS
    return error.status == 503 and not error.details.get("released")


def _where(detail: Any) -> str:
    """The fields a refused body got wrong, for the exception's message: ``(documents.0.text:
    Input should be a valid string)``."""
    if not isinstance(detail, list):
        return ""
    found = []
    for entry in detail[:5]:
        if not isinstance(entry, dict):
            continue
        loc = entry.get("loc")
        parts = loc if isinstance(loc, list | tuple) else [] if loc is None else [loc]
        found.append(f"{'.'.join(str(part) for part in parts)}: {entry.get('msg', '')}")
    where = "; ".join(found)[:300]  # whatever the body holds, never an error of its own
    return f" ({where})" if where else ""


def _error(response: httpx.Response, key: str | None = None) -> SentDPError:
    """The server's error envelope as the matching exception (or a generic one)."""
    try:
        payload = response.json()["error"]
        code, message = str(payload["code"]), str(payload["message"])
        details = {k: v for k, v in payload.items() if k not in ("code", "message")}
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", response.text[:200], {}
    message += _where(details.get("detail"))
    status = response.status_code
    kind: type[SentDPError] = SentDPError
    if code == "http_error" and status in (502, 504):
        kind = OutcomeUnknownError
    elif status == 402:
        kind = BudgetExhaustedError
    elif status == 401:
        kind = AuthenticationError
    elif code in CHARGE_STANDS or (
        code == "internal_error" and key is not None and details.get("charged") is not False
    ):
        kind = OutcomeUnknownError  # a charged call's internal_error may follow its charge
    elif status == 429 or code == "idempotency_key_in_flight" or status >= 500:
        kind = UnavailableError
    elif 400 <= status < 500:
        kind = InvalidRequestError
    return kind(status, code, message, details, key)
