"""The Python client against a real server: typed answers, retries that reuse the key,
refusals as exceptions, and the README's example run as a backend engineer would."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from sentdp_client import (
    AuthenticationError,
    BudgetExhaustedError,
    Client,
    Document,
    InvalidRequestError,
    OutcomeUnknownError,
    UnavailableError,
)
from tests.support import TENANTS, ledger_of

pytestmark = pytest.mark.server
ACME, TINY = TENANTS[0], TENANTS[2]
BBC_LABELS = ("business", "entertainment", "politics", "sports", "tech")
TEXT = "The match ended late. The home side won. Fans sang in the rain."


def test_privatize_classify_budget_and_a_replay_that_costs_nothing(server) -> None:
    with Client(server.url, ACME.key) as sentdp:
        first = sentdp.privatize(
            "c-user", 2.0, [TEXT, ["One sentence.", "Two."]], idempotency_key="c-1"
        )
        again = sentdp.privatize(
            "c-user", 2.0, [TEXT, ["One sentence.", "Two."]], idempotency_key="c-1"
        )
        assert [d.k for d in first.documents] == [3, 2]
        assert all(len(d.embedding or []) == 384 for d in first.documents)
        # the quick bundle draws by Tukey depth: the client reads the rule, variant and p
        assert {(d.selection, d.variant) for d in first.documents} == {("depth", "paper")}
        assert all(d.p is not None and d.p >= 1 for d in first.documents)
        assert first.budget.spent_epsilon == pytest.approx(4.0)
        assert (first.replayed, again.replayed) == (False, True)
        assert [d.candidate for d in again.documents] == [d.candidate for d in first.documents]
        assert sentdp.budget("c-user").spent_epsilon == pytest.approx(4.0)
        labelled = sentdp.classify("c-user", 1.0, [Document(text=TEXT)])
        assert labelled.documents[0].label in BBC_LABELS
        candidate = first.documents[0].candidate
        assert candidate is not None
        free = sentdp.labels(first.model, [candidate])
        assert set(free) == {candidate}
        assert sentdp.budget("c-user").spent_epsilon == pytest.approx(5.0)


def test_refusals_are_typed_exceptions(server) -> None:
    with Client(server.url, TINY.key) as tiny:
        with pytest.raises(InvalidRequestError) as invalid:
            tiny.privatize("c-user", 5.0, [TEXT])  # above the tenant's maximum epsilon
        assert (invalid.value.status, invalid.value.code) == (400, "invalid_epsilon")
    with Client(server.url, TENANTS[3].key) as broke, pytest.raises(BudgetExhaustedError) as no:
        broke.privatize("c-user", 1.0, [TEXT])
    assert no.value.remaining == 0.0
    with Client(server.url, "sdp_wrong", retries=0) as wrong, pytest.raises(AuthenticationError):
        wrong.budget("c-user")
    with Client(server.url, ACME.key) as sentdp, pytest.raises(TypeError, match="wrap"):
        sentdp.privatize("c-user", 1.0, TEXT)  # type: ignore[arg-type]


def test_a_refunded_503_is_retried_with_the_same_key_and_never_charged(server) -> None:
    sentdp = Client(server.url, ACME.key, retries=2, backoff=0.05)
    with sentdp, pytest.raises(UnavailableError) as failed:
        sentdp.privatize("r-user", 1.0, [["FAULT:before", "x"]], idempotency_key="r-1")
    assert failed.value.status == 503
    charges = [c for c in ledger_of(server).charges("acme") if c["user"] == "r-user"]
    assert [c["state"] for c in charges] == ["refunded"] * 3  # the first try and two retries
    assert ledger_of(server).account("acme", "r-user").spent_micro == 0


def test_a_failure_after_sampling_is_not_retried(server) -> None:
    sentdp = Client(server.url, ACME.key, retries=3, backoff=0.05)
    with sentdp, pytest.raises(OutcomeUnknownError) as lost:
        sentdp.privatize("s-user", 1.0, [["FAULT:after", "x"]])
    assert lost.value.code == "mechanism_failed"
    charges = [c for c in ledger_of(server).charges("acme") if c["user"] == "s-user"]
    assert len(charges) == 1  # one charge: the client did not spend the budget again


def test_connection_failures_408_and_429_are_retried_with_one_key() -> None:
    """The retry policy on an in-process transport: a dropped connection, then 408 (the body
    arrived too slowly), then 429, then 200; every attempt carries the same
    Idempotency-Key."""
    keys: list[str | None] = []
    answers = iter(["drop", 408, 429, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers.get("idempotency-key"))
        answer = next(answers)
        if answer == "drop":
            raise httpx.ConnectError("connection reset", request=request)
        if answer == 408:
            late = {"error": {"code": "body_timeout", "message": "slow"}}
            return httpx.Response(408, json=late)
        if answer == 429:
            return httpx.Response(429, json={"error": {"code": "tenant_busy", "message": "busy"}})
        budget = {
            "user": "u", "spent_epsilon": 1.0, "limit": 10.0, "remaining": 9.0,
            "remaining_epsilon": 9.0, "group_size": 1,
        }  # fmt: skip
        return httpx.Response(
            200,
            json={"model": "m:1", "documents": [{"k": 2, "epsilon": 1.0}], "budget": budget},
        )

    transport = httpx.MockTransport(handler)
    with Client("http://sentdp", "key", backoff=0.0, transport=transport) as sentdp:
        release = sentdp.privatize("u", 1.0, ["A. B."])
    assert release.budget.remaining == 9.0
    assert len(keys) == 4
    assert len(set(keys)) == 1
    assert keys[0] == release.idempotency_key


def test_a_reply_that_was_not_kept_is_raised_as_charged_and_not_retried() -> None:
    """410 reply_not_kept (the replay of a served request whose reply the server did not
    keep): the charge stands, so the client raises OutcomeUnknownError after one attempt."""
    calls: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers.get("idempotency-key"))
        gone = {"error": {"code": "reply_not_kept", "message": "served and charged"}}
        return httpx.Response(410, json=gone, headers={"Idempotent-Replayed": "true"})

    transport = httpx.MockTransport(handler)
    sentdp = Client("http://sentdp", "key", backoff=0.0, transport=transport)
    with sentdp, pytest.raises(OutcomeUnknownError) as gone:
        sentdp.privatize("u", 1.0, ["A. B."], idempotency_key="lost-1")
    assert (gone.value.status, gone.value.code, gone.value.idempotency_key) == (
        410,
        "reply_not_kept",
        "lost-1",
    )
    assert calls == ["lost-1"]


def test_an_internal_error_of_a_charged_call_is_raised_as_charged_and_not_retried() -> None:
    """500 internal_error (a server bug) may follow a charge: on /privatize the client raises
    OutcomeUnknownError after one attempt, with its key; on /budget, or where the server says
    nothing was charged, it is UnavailableError (not retried either)."""
    calls: list[str | None] = []
    refunded = {"code": "internal_error", "message": "nothing was drawn", "charged": False}
    answers = iter([{"code": "internal_error", "message": "the service failed"}] * 2 + [refunded])

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.headers.get("idempotency-key"))
        return httpx.Response(500, json={"error": next(answers)})

    transport = httpx.MockTransport(handler)
    sentdp = Client("http://sentdp", "key", retries=3, backoff=0.0, transport=transport)
    with sentdp:
        with pytest.raises(OutcomeUnknownError) as charged:
            sentdp.privatize("u", 1.0, ["A. B."], idempotency_key="bug-1")
        with pytest.raises(UnavailableError):
            sentdp.budget("u")
        with pytest.raises(UnavailableError) as refused:  # every charge refunded: says so
            sentdp.privatize("u", 1.0, ["A. B."], idempotency_key="bug-2")
    assert (charged.value.status, charged.value.idempotency_key) == (500, "bug-1")
    assert refused.value.details == {"charged": False}
    assert calls[0] == "bug-1"
    assert len(calls) == 3  # one attempt each


def test_a_retry_waits_at_least_what_the_server_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """429 with ``Retry-After: 1`` (sentdp's tenant_busy): the client waits 1 s, not its
    shorter backoff; a longer backoff stands; an absurd header is cut to 60 s, and one that
    is not a number of seconds is ignored."""
    import sentdp_client.client as module

    slept: list[float] = []
    monkeypatch.setattr(module.time, "sleep", slept.append)
    answers = iter(["1", "1", "86400", "soon", "nan", "1"])

    def handler(request: httpx.Request) -> httpx.Response:
        body = {"error": {"code": "tenant_busy", "message": "busy"}}
        return httpx.Response(429, json=body, headers={"Retry-After": next(answers)})

    transport = httpx.MockTransport(handler)
    sentdp = Client("http://sentdp", "key", retries=5, backoff=0.5, transport=transport)
    with sentdp, pytest.raises(UnavailableError):
        sentdp.privatize("u", 1.0, ["A. B."])
    # backoffs 0.5, 1, 2, 4, 8; a date-like or NaN header counts as none; the last 429 is
    # not retried
    assert slept == [1.0, 1.0, 60.0, 4.0, 8.0]


def test_a_proxy_timeout_is_retried_under_one_key_then_reported_with_it() -> None:
    keys: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers.get("idempotency-key"))
        return httpx.Response(504, text="<html>gateway timeout</html>")

    transport = httpx.MockTransport(handler)
    sentdp = Client("http://sentdp", "key", retries=2, backoff=0.0, transport=transport)
    with sentdp, pytest.raises(OutcomeUnknownError) as unknown:
        sentdp.privatize("u", 1.0, ["A. B."], idempotency_key="k-504")
    assert keys == ["k-504"] * 3
    assert unknown.value.idempotency_key == "k-504"
    assert unknown.value.status == 504

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    refused = Client(
        "http://sentdp", "key", retries=1, backoff=0.0, transport=httpx.MockTransport(unreachable)
    )
    with refused, pytest.raises(UnavailableError) as down:
        refused.privatize("u", 1.0, ["A. B."])
    assert down.value.code == "connection_failed"
    assert down.value.idempotency_key is not None


def test_the_example_runs_against_the_server(server) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sentdp_client.example", server.url, ACME.key],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "embedding of 384 numbers, 3 sentences" in done.stdout
    assert "refused:" in done.stdout
    assert "(remaining " in done.stdout


def test_a_refused_body_names_its_wrong_fields_in_the_message() -> None:
    """A trial: `privatize('u', epsilon='2.5', ...)` said only "1 validation error in the
    request body"; the fields are in the server's detail list."""
    refused = {
        "code": "invalid_body",
        "message": "1 validation error in the request body",
        "detail": [{"type": "float_type", "loc": ["epsilon"], "msg": "Input should be a number"}],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": refused})

    transport = httpx.MockTransport(handler)
    sentdp = Client("http://sentdp", "key", transport=transport)
    with sentdp, pytest.raises(InvalidRequestError) as invalid:
        sentdp.privatize("u", "2.5", ["A. B."])  # type: ignore[arg-type]
    assert str(invalid.value).endswith("(epsilon: Input should be a number)")
    assert invalid.value.details["detail"] == refused["detail"]


@pytest.mark.parametrize(
    ("detail", "where"),
    [
        ([{"loc": None, "msg": "m"}], " (: m)"),
        ([{"loc": 3, "msg": "m"}], " (3: m)"),
        ([{"loc": "user", "msg": "m"}], " (user: m)"),
        ([{"loc": ["documents", 0], "msg": "x" * 500}], " (documents.0: " + "x" * 287 + ")"),
        ("not a list", ""),
        ([1, None], ""),
    ],
)
def test_an_odd_detail_list_never_hides_the_error(detail: object, where: str) -> None:
    """The message's field list is built from whatever the body holds; it never raises in
    place of the server's error (a charged call's class says whether to retry)."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = {"code": "invalid_body", "message": "refused", "detail": detail}
        return httpx.Response(400, json={"error": body})

    transport = httpx.MockTransport(handler)
    sentdp = Client("http://sentdp", "key", transport=transport)
    with sentdp, pytest.raises(InvalidRequestError) as invalid:
        sentdp.privatize("u", 1.0, ["A. B."])
    assert invalid.value.message == "refused" + where


def test_budget_carries_the_accountant_s_spend() -> None:
    """A zCDP tenant's spend is in rho: the typed Budget carries it, not only ``raw``."""
    answer = {
        "user": "u", "spent_epsilon": 2.0, "limit": 10.0, "remaining": 8.0,
        "remaining_epsilon": 8.0, "group_size": 1, "documents": 2, "period": 0,
        "accounting": "zcdp", "spend": 0.25, "spend_limit": 1.5, "spend_unit": "rho",
    }  # fmt: skip

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer)

    with Client("http://sentdp", "key", transport=httpx.MockTransport(handler)) as sentdp:
        budget = sentdp.budget("u")
    assert (budget.accounting, budget.spend, budget.spend_limit, budget.spend_unit) == (
        "zcdp", 0.25, 1.5, "rho",
    )  # fmt: skip
