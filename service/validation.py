"""Checks of a charged request that need no database: epsilon, sizes, the sentences.

Pure functions raising :class:`~service.errors.ApiError`; messages name positions, counts
and limits, never text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sentdp.accounting import PER_DOCUMENT, charge_for
from sentdp.errors import InputError, LimitError
from sentdp.text import SentenceSplitter, TextLimits, prepare_sentences, split_document
from service.errors import ApiError, Code
from service.schemas import DocumentIn


@dataclass(frozen=True)
class Limits:
    """Size limits per request, and how much work one tenant may have in flight."""

    max_documents: int
    text: TextLimits
    max_request_sentences: int = 1000
    """Sentences of all documents of one request."""
    max_request_tokens: int = 40_000
    """Work of one request in padded tokens (:func:`service.charging.work_cost`, about 7 s
    on 2 CPU cores): the largest request must finish well within the worker's timeout."""
    tenant_inflight_tokens: int = 40_000
    """Padded tokens one tenant may have in flight in this gateway process; more is refused
    with 429 before anything is charged."""
    start_timeout: float = 30.0
    """Seconds a request may wait for the worker; one not started by then is refunded."""
    tenant_checks: int = 1
    """A tenant's requests checked (split, tokenized, signed) at once in this process."""
    tenant_checks_waiting: int = 256
    """A tenant's requests that may wait to be checked; more is refused with 429."""
    tenant_inflight_requests: int = 64
    """Requests one tenant may have in flight in this process, however small."""
    tenant_stored_reply_bytes: int | None = None
    """Bytes of one tenant's replies the ledger keeps for Idempotency-Key retries (None: no
    bound); a reply past it is kept as a short ``reply_not_kept`` stand-in."""


def finite_epsilon(epsilon: float) -> float:
    """``epsilon`` if it is a finite number above 0; 400 otherwise."""
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ApiError(
            Code.INVALID_EPSILON,
            "epsilon must be a finite number above 0 (and above the mechanism's float slack, "
            f"a few millionths), got {epsilon!r}",
        )
    return epsilon


def charge_of(epsilon: float, max_epsilon: float, slack: float) -> int:
    """Micro-epsilon charged for one document at ``epsilon``: above the mechanism's slack,
    at most the tenant's maximum."""
    if epsilon <= slack:
        raise ApiError(
            Code.INVALID_EPSILON,
            f"epsilon must be a finite number above the mechanism's float slack {slack:.2g}, "
            f"got {epsilon!r}",
        )
    if epsilon > max_epsilon:
        raise ApiError(
            Code.INVALID_EPSILON,
            f"epsilon {epsilon!r} is above this tenant's maximum of {max_epsilon!r}",
        )
    try:
        return charge_for(epsilon)
    except InputError as error:
        raise ApiError(Code.INVALID_EPSILON, str(error)) from None


def request_sentences(
    documents: list[DocumentIn], splitter: SentenceSplitter, limits: Limits
) -> list[list[str]]:
    """Every document's sentences (the privacy units), within the size limits."""
    if len(documents) > limits.max_documents:
        raise ApiError(
            Code.TOO_MANY_DOCUMENTS,
            f"{len(documents)} documents in one request; the limit is {limits.max_documents}",
        )
    sentences = [
        document_sentences(n, doc, splitter, limits.text) for n, doc in enumerate(documents)
    ]
    total = sum(len(s) for s in sentences)
    if total > limits.max_request_sentences:
        raise ApiError(
            Code.REQUEST_TOO_LARGE,
            f"{total} sentences in one request; the limit is {limits.max_request_sentences} "
            "(send the documents in several requests)",
        )
    return sentences


def document_ids(documents: list[DocumentIn], composition: str) -> tuple[str, ...]:
    """The documents' ids under per-document accounting (each must have one); none under
    sequential accounting (where an id would suggest a protection the tenant does not have)."""
    ids = [document.document_id for document in documents]
    if composition == PER_DOCUMENT:
        missing = [n for n, found in enumerate(ids) if found is None]
        if missing:
            raise ApiError(
                Code.INVALID_DOCUMENT,
                f"document {missing[0]}: this tenant accounts per document, so every document "
                "needs its stable 'document_id' (reuse it when the document is re-sent or edited)",
            )
        return tuple(found for found in ids if found is not None)
    if any(found is not None for found in ids):
        raise ApiError(
            Code.INVALID_DOCUMENT,
            "this tenant accounts sequentially (every release adds up), so documents take no "
            "'document_id'; remove it",
        )
    return ()


def check_cost(tokens: int, limits: Limits) -> int:
    """``tokens`` (a request's padded tokens) if within the limit; 413 otherwise."""
    if tokens > limits.max_request_tokens:
        raise ApiError(
            Code.REQUEST_TOO_LARGE,
            f"the request's work is {tokens} padded tokens (its distinct sentences' encoding "
            f"plus one per sentence); the limit is "
            f"{limits.max_request_tokens} (send the documents in several requests)",
        )
    return tokens


def document_sentences(
    position: int, document: DocumentIn, splitter: SentenceSplitter, limits: TextLimits
) -> list[str]:
    """One document's sentences: given ones prepared, or raw text split."""
    try:
        if document.sentences is not None:
            return prepare_sentences(document.sentences, limits)
        return split_document(document.text or "", splitter, limits)
    except LimitError as error:
        raise ApiError(Code.DOCUMENT_TOO_LARGE, f"document {position}: {error}") from None
    except InputError as error:
        raise ApiError(Code.INVALID_DOCUMENT, f"document {position}: {error}") from None
