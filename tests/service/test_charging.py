"""The charged-request flow with a real SQLite ledger and a fake worker that runs the real
mechanism: reserve, refund and settle on every path, in seconds and without a server."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sentdp.accounting import MICRO
from sentdp.bundle import Bundle
from sentdp.text import TextLimits
from service import charging as charging_module
from service.charging import ChargedRequest, Charging, Reply, work_cost
from service.errors import UNEXPECTED_FAILURE, ApiError
from service.idempotency import BodySigner, caller_secret
from service.ledger import SqlLedger, open_ledger
from service.scheduling import TenantChecks
from service.schemas import CLOSED_ERROR, LATE_ERROR, DocumentIn, WorkRequest, WorkResult
from service.tenants import Tenant
from service.validation import Limits
from service.views import label_of
from tests.service.fakes import DIM, FakeWorker, embed, tiny_bundle
from tests.support import Concurrency, age_pending_keys, logged_events, wait_for

BUNDLE = tiny_bundle()
VERSION = "sentdp-unit:v1"
ACME = Tenant(id="acme", key_sha256=["a" * 64], max_epsilon=10, group_size=1, budget=100)
PAIRS = Tenant(id="pairs", key_sha256=["b" * 64], max_epsilon=10, group_size=2, budget=10)
UNSEEDED_FIT = 1e-5
"""The draws below come from the CSPRNG: a right flow fails a fit with this probability."""

TEXT = "The striker scored twice. The crowd cheered. The manager was pleased."


@pytest.fixture
def ledger(tmp_path: Path) -> SqlLedger:
    opened = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    yield opened
    opened.close()


def charging(
    ledger: SqlLedger,
    worker: FakeWorker,
    max_documents: int = 4,
    inflight: int = 60,
    start_timeout: float = 30.0,
    bundle: Bundle = BUNDLE,
) -> Charging:
    limits = Limits(
        max_documents,
        TextLimits(max_sentences=10, max_sentence_chars=200),
        max_request_sentences=20,
        max_request_tokens=40,  # 1 per distinct sentence + 1 per sentence
        tenant_inflight_tokens=inflight,
        start_timeout=start_timeout,
    )
    return Charging(bundle, VERSION, ledger, worker, limits, BodySigner(b"k" * 32))


def request(
    user: str = "alice",
    epsilon: float = 2.0,
    documents: list[dict] | None = None,
    tenant: Tenant = ACME,
    **kwargs,
) -> ChargedRequest:
    docs = [DocumentIn.model_validate(d) for d in (documents or [{"text": TEXT}])]
    kwargs.setdefault("caller", caller_secret(f"{tenant.id}-api-key"))
    return ChargedRequest(tenant=tenant, user=user, epsilon=epsilon, documents=docs, **kwargs)


def run(flow: Charging, req: ChargedRequest) -> tuple[Reply, dict]:
    reply = asyncio.run(flow.handle(req))
    return reply, json.loads(reply.body)


def gated(worker: FakeWorker, gate: asyncio.Event):  # type: ignore[no-untyped-def]
    """The worker, held until ``gate`` is set (a request in flight)."""

    async def held(work):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await worker(work)

    return held


def states(ledger: SqlLedger) -> list[str]:
    return [c["state"] for c in ledger.charges()]


def assert_never_refunded_after_sampling(ledger: SqlLedger, worker: FakeWorker) -> None:
    refunded = {c["id"] for c in ledger.charges() if c["state"] == "refunded"}
    assert not refunded & set(worker.journal)


def test_a_charged_request_releases_candidates_and_debits_once(ledger: SqlLedger) -> None:
    worker = FakeWorker(BUNDLE)
    docs = [{"text": TEXT}, {"sentences": ["One.", "Two."]}]
    reply, body = run(charging(ledger, worker), request(epsilon=2.5, documents=docs))
    assert reply.status == 200, body
    choice = BUNDLE.manifest.choice_for(2.5)
    assert [d["k"] for d in body["documents"]] == [3, 2]
    for document in body["documents"]:
        variant, local = BUNDLE.locate(document["candidate"])
        assert variant.record.name == choice.variant == document["variant"]
        np.testing.assert_array_equal(document["embedding"], variant.candidates[local])
        assert (document["epsilon"], document["p"]) == (2.5, choice.p)
        assert "label" not in document
    assert body["model"] == VERSION
    assert body["budget"]["spent_epsilon"] == 5.0
    assert body["budget"]["remaining"] == 95.0
    assert ledger.account("acme", "alice").spent_micro == 5 * MICRO
    assert states(ledger) == ["final", "final"]


def test_the_gateway_sends_and_reports_the_rule_the_p_table_names(ledger: SqlLedger) -> None:
    """At an epsilon whose p table entry is the clipped-mean rule the worker is told the rule
    and its radius, and the response says which rule drew the candidate (no p); below it,
    Tukey depth with p."""
    from tests.service.fakes import RADIUS

    bundle = tiny_bundle(mean=True)
    worker = FakeWorker(bundle)
    sent: list[WorkRequest] = []

    async def recording(work: WorkRequest) -> list:  # type: ignore[type-arg]
        sent.append(work)
        return await worker(work)

    flow = charging(ledger, worker, bundle=bundle)
    flow.worker = recording
    reply, body = run(flow, request(epsilon=6.0, with_labels=True))
    assert reply.status == 200, body
    (work,) = sent
    assert [(i.selection, i.radius, i.variant) for i in work.items] == [("mean", RADIUS, "paper")]
    (document,) = body["documents"]
    assert document["selection"] == "mean"
    assert "p" not in document
    assert document["variant"] == "paper"
    assert document["label_mechanism"] == "candidate"
    reply, body = run(flow, request(user="bob", epsilon=2.0))
    assert [(i.selection, i.radius, i.p) for i in sent[1].items] == [("depth", None, 3)]
    assert (body["documents"][0]["selection"], body["documents"][0]["p"]) == ("depth", 3)


def test_classify_adds_the_label_of_the_released_candidate(ledger: SqlLedger) -> None:
    reply, body = run(charging(ledger, FakeWorker(BUNDLE)), request(with_labels=True))
    assert reply.status == 200
    (document,) = body["documents"]
    expected = label_of(BUNDLE, document["candidate"])
    assert (document["label"], document["probabilities"]) == (
        expected.label,
        expected.probabilities,
    )


def test_classify_draws_the_vote_where_the_bundle_says_so_and_releases_the_label_only(
    ledger: SqlLedger,
) -> None:
    bundle = tiny_bundle(vote=True)
    worker = FakeWorker(bundle)
    flow = charging(ledger, worker, bundle=bundle)
    two = [{"text": TEXT}, {"sentences": ["One.", "Two."]}]
    reply, body = run(flow, request(epsilon=1.0, with_labels=True, documents=two))
    assert reply.status == 200, body
    for document in body["documents"]:
        assert document["label_mechanism"] == "sentence-vote"
        assert document["label"] in bundle.labels
        # nothing computed from the private sentences but the drawn label
        assert set(document) == {"label", "label_mechanism", "k", "epsilon"}
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO
    reply, body = run(flow, request(user="bob", epsilon=5.0, with_labels=True))
    (document,) = body["documents"]
    assert document["label_mechanism"] == "candidate"
    assert len(document["embedding"]) == DIM
    reply, body = run(flow, request(user="carol", epsilon=1.0))  # /privatize: the candidate
    assert "embedding" in body["documents"][0]
    assert "label_mechanism" not in body["documents"][0]


@pytest.mark.parametrize(
    ("second_vote", "by_count", "cube"),
    [(False, False, False), (True, False, False), (False, True, False), (True, True, True)],
)
def test_the_vote_of_a_request_follows_its_exact_distribution(
    ledger: SqlLedger, second_vote: bool, by_count: bool, cube: bool
) -> None:
    """With two votes, the one the p table names for the request's epsilon draws the label;
    a vote by count draws a one-sentence document from the calibrated distribution; a cube
    vote (beside a vote by count) from the cube's permute-and-flip."""
    from scipy.stats import chisquare

    from sentdp.labels import vote_log_probs

    bundle = tiny_bundle(vote=True, second_vote=second_vote, by_count=by_count, cube=cube)
    worker = FakeWorker(bundle)
    flow = charging(ledger, worker, bundle=bundle)
    sentences = ["The team lost."] if by_count else ["Shares fell.", "The match was won."]
    sentences += [] if by_count else ["A new phone."]
    if cube:  # sentences whose top class is far from sure: there the two shapes differ most
        sentences = ["It was fine.", "The match was won.", "Markets rallied."]
    counts = dict.fromkeys(bundle.labels, 0)
    # 12,000 one-sentence draws tell the calibrated draw from permute-and-flip (noncentrality
    # 167: 4,000 draws, at 56, failed p < 1e-6 about once in 90 runs); 1,600 suffice elsewhere
    for n in range(3000 if by_count else 400):
        documents = [{"sentences": sentences}] * 4
        _, body = run(
            flow, request(user=f"u{n}", epsilon=1.0, with_labels=True, documents=documents)
        )
        for document in body["documents"]:
            counts[document["label"]] += 1
    embedded = np.stack([embed(s) for s in sentences])
    exact = [np.exp(vote.log_probs(embedded, 1.0)) for vote in bundle.votes]
    observed = [counts[label] for label in bundle.labels]
    used = 1 if second_vote else 0
    assert chisquare(observed, exact[used] * sum(observed)).pvalue > UNSEEDED_FIT
    if second_vote:  # the other vote's distribution is told apart: the test sees which ran
        assert chisquare(observed, exact[0] * sum(observed)).pvalue < 1e-6
    if by_count and not cube:  # ... and so is permute-and-flip's
        flip = np.exp(vote_log_probs(bundle.votes[0].deviations(embedded), 1.0))
        assert chisquare(observed, flip * sum(observed)).pvalue < 1e-6
    if cube:  # ... and the same classifier's simplex votes
        simplex = np.exp(bundle.votes[1].shaped("simplex").log_probs(embedded, 1.0))
        assert chisquare(observed, simplex * sum(observed)).pvalue < 1e-6


def test_a_zcdp_tenant_s_votes_are_drawn_with_bounded_range(ledger: SqlLedger) -> None:
    """A zCDP tenant pays rho = epsilon**2 / 8 per release, true of epsilon-bounded-range
    mechanisms only: its votes come from the exponential mechanism, not from the vote's own
    rule (permute-and-flip for these three-sentence documents), which a pure-epsilon tenant
    of the same bundle gets."""
    from scipy.stats import chisquare

    zcdp = Tenant(
        id="zed",
        key_sha256=["c" * 64],
        max_epsilon=10,
        group_size=1,
        budget=10_000,
        accounting="zcdp",
        delta=1e-6,
    )
    bundle = tiny_bundle(vote=True, by_count=True)
    flow = charging(ledger, FakeWorker(bundle), bundle=bundle)
    sentences = ["The team lost."] * 3
    observed = {"zed": dict.fromkeys(bundle.labels, 0), "acme": dict.fromkeys(bundle.labels, 0)}
    for n in range(500):  # 2,000 draws each
        for tenant in (zcdp, ACME):
            documents = [{"sentences": sentences}] * 4
            _, body = run(
                flow,
                request(
                    user=f"u{n}", epsilon=1.0, with_labels=True, documents=documents, tenant=tenant
                ),
            )
            for document in body["documents"]:
                assert document["label_mechanism"] == "sentence-vote"
                observed[tenant.id][document["label"]] += 1
    vote = bundle.votes[0]
    embedded = np.stack([embed(s) for s in sentences])
    bounded = np.exp(vote.log_probs(embedded, 1.0, bounded_range=True))
    own = np.exp(vote.log_probs(embedded, 1.0))
    zed = [observed["zed"][label] for label in bundle.labels]
    acme = [observed["acme"][label] for label in bundle.labels]
    assert chisquare(zed, bounded * sum(zed)).pvalue > UNSEEDED_FIT
    assert chisquare(zed, own * sum(zed)).pvalue < 1e-6  # the test sees which ran
    assert chisquare(acme, own * sum(acme)).pvalue > UNSEEDED_FIT
    assert chisquare(acme, bounded * sum(acme)).pvalue < 1e-6


def test_the_gateway_sends_the_p_table_s_table_limit_and_short_documents_follow_the_table(
    ledger: SqlLedger,
) -> None:
    """The work item carries the p table's ``vote_table``, so a pure-epsilon tenant's
    three-sentence documents are drawn from the hard-vote table (limit 3: the boundary),
    a zCDP tenant's never."""
    from scipy.stats import chisquare

    from sentdp.labels import hard_counts
    from sentdp.vote_table import hard_vote_table

    bundle = tiny_bundle(vote=True, table=3)
    worker = FakeWorker(bundle)
    flow = charging(ledger, worker, bundle=bundle)
    # unanimous hard votes: where the table is sharpest, so 1,200 draws tell the rules apart
    sentences = ["The team won."] * 3
    observed = dict.fromkeys(bundle.labels, 0)
    for n in range(300):  # 1,200 draws
        _, body = run(
            flow,
            request(
                user=f"u{n}",
                epsilon=1.0,
                with_labels=True,
                documents=[{"sentences": sentences}] * 4,
            ),
        )
        for document in body["documents"]:
            observed[document["label"]] += 1
    vote = bundle.votes[0]
    embedded = np.stack([embed(s) for s in sentences])
    table = hard_vote_table(3, vote.classes, 1.0).probabilities(hard_counts(vote.logits(embedded)))
    own = np.exp(vote.log_probs(embedded, 1.0))
    counts = [observed[label] for label in bundle.labels]
    assert chisquare(counts, table * sum(counts)).pvalue > UNSEEDED_FIT
    assert chisquare(counts, own * sum(counts)).pvalue < 1e-6  # the test sees which ran


def test_a_vote_s_epsilon_must_clear_the_vote_s_own_slack(ledger: SqlLedger) -> None:
    """32 classes: the vote's float slack (~2e-6) is above the charge unit and above the
    variant's (32 candidates), so the gateway must refuse what the worker could not run."""
    from sentdp.labels import vote_slack
    from sentdp.mechanism import privacy_slack

    bundle = tiny_bundle(m=32, vote=True, labels=[f"class-{n}" for n in range(32)])
    below = 1.5e-6
    assert privacy_slack(32) < below < vote_slack(32)
    worker = FakeWorker(bundle)
    flow = charging(ledger, worker, bundle=bundle)
    reply, body = run(flow, request(epsilon=below, with_labels=True))
    assert (reply.status, body["error"]["code"]) == (400, "invalid_epsilon")
    assert ledger.charges() == []
    assert worker.calls == 0
    reply, body = run(flow, request(epsilon=below))  # /privatize draws a candidate: fine
    assert reply.status == 200, body
    reply, body = run(flow, request(epsilon=3e-6, with_labels=True))
    assert reply.status == 200, body
    assert body["documents"][0]["label_mechanism"] == "sentence-vote"


def test_housekeeping_purges_stored_replies_past_their_window_with_no_request(
    ledger: SqlLedger,
) -> None:
    """A stored reply (an embedding, a user id) leaves the ledger after its 24 hours although
    no charged request comes to trigger the purge: the gateway's timer calls housekeep, which
    runs the purge on the ledger's threads and says how many rows went."""
    from service.ledger import IDEMPOTENCY_TTL_SECONDS

    flow = charging(ledger, FakeWorker(BUNDLE))
    reply, _ = run(flow, request(idempotency_key="old"))
    assert reply.status == 200
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 60)
    assert asyncio.run(flow.housekeep()) == 0  # the request's own reservation purged this minute
    ledger._last_purge = -math.inf  # a minute later
    assert asyncio.run(flow.housekeep()) == 1
    with ledger.transaction() as cur:
        assert ledger._execute(cur, "SELECT COUNT(*) FROM sentdp_idempotency").fetchone()[0] == 0
    assert ledger.account("acme", "alice").spent_micro > 0  # the charge stays


def test_an_unaffordable_request_is_refused_whole_with_the_figures(ledger: SqlLedger) -> None:
    flow = charging(ledger, FakeWorker(BUNDLE))
    assert run(flow, request(tenant=PAIRS, epsilon=4.0))[0].status == 200  # 2 * 4 = 8 of 10
    reply, body = run(flow, request(tenant=PAIRS, epsilon=0.5, documents=[{"text": "A."}] * 3))
    assert reply.status == 402
    assert body["error"] | {"message": ""} == {
        "code": "budget_exhausted",
        "message": "",
        "requested": 1.5,
        "spent_epsilon": 4.0,
        "group_size": 2,
        "limit": 10.0,
        "remaining": 2.0,  # in the tenant's units: group epsilon
        "remaining_epsilon": 1.0,  # what this user may still request: comparable to requested
    }
    assert ledger.account("pairs", "alice").spent_micro == 4 * MICRO
    assert len(ledger.charges()) == 1  # nothing of the refused request was written
    assert run(flow, request(tenant=PAIRS, epsilon=1.0))[0].status == 200  # exactly the limit


def test_a_worker_that_did_not_run_refunds_everything_and_frees_the_key(
    ledger: SqlLedger,
) -> None:
    worker = FakeWorker(BUNDLE, mode="not_run")
    flow = charging(ledger, worker)
    reply, body = run(flow, request(idempotency_key="k1", documents=[{"text": TEXT}] * 2))
    assert reply.status == 503
    assert body["error"]["code"] == "worker_unavailable"
    assert body["error"]["released"] == []
    assert states(ledger) == ["refunded", "refunded"]
    assert ledger.account("acme", "alice").spent_micro == 0
    worker.mode = "ok"
    retried, _ = run(flow, request(idempotency_key="k1", documents=[{"text": TEXT}] * 2))
    assert retried.status == 200
    assert not retried.replayed
    assert worker.calls == 2
    assert ledger.account("acme", "alice").spent_micro == 4 * MICRO


def test_a_request_late_behind_its_own_tenant_gets_429_refunded_and_frees_the_key(
    ledger: SqlLedger,
) -> None:
    """The worker says the tenant's own earlier requests held it until the deadline: the
    tenant sends faster than it is served (429 and Retry-After, as at admission), not a
    failing service (503); nothing was drawn, so everything is refunded."""
    worker = FakeWorker(BUNDLE, mode="backlog")
    flow = charging(ledger, worker)
    reply, body = run(flow, request(idempotency_key="k2", documents=[{"text": TEXT}] * 2))
    assert reply.status == 429
    assert reply.headers == {"Retry-After": "1"}
    assert body["error"]["code"] == "tenant_busy"
    assert body["error"]["released"] == []
    assert states(ledger) == ["refunded", "refunded"]
    assert ledger.account("acme", "alice").spent_micro == 0
    worker.mode = "ok"
    retried, _ = run(flow, request(idempotency_key="k2", documents=[{"text": TEXT}] * 2))
    assert (retried.status, retried.replayed) == (200, False)
    assert ledger.account("acme", "alice").spent_micro == 4 * MICRO


def test_a_backlog_refund_beside_sampled_documents_still_releases_them(
    ledger: SqlLedger,
) -> None:
    """Only a request none of whose documents was drawn is a 429: a sampled document's
    embedding and its final charge are never lost behind a busy answer."""
    worker = FakeWorker(BUNDLE, mode="partial_backlog")
    reply, body = run(charging(ledger, worker), request(documents=[{"text": TEXT}] * 2))
    assert reply.status == 503
    assert len(body["error"]["released"]) == 1
    assert states(ledger) == ["refunded", "final"]
    assert_never_refunded_after_sampling(ledger, worker)


def test_a_worker_failure_after_sampling_keeps_every_charge(ledger: SqlLedger) -> None:
    worker = FakeWorker(BUNDLE, mode="after")
    reply, body = run(charging(ledger, worker), request(documents=[{"text": TEXT}] * 2))
    assert reply.status == 500
    assert body["error"]["code"] == "mechanism_failed"
    assert states(ledger) == ["final", "final"]
    assert ledger.account("acme", "alice").spent_micro == 4 * MICRO
    assert len(worker.journal) == 2
    assert_never_refunded_after_sampling(ledger, worker)


def test_a_retry_after_a_failure_after_sampling_replays_it_and_costs_nothing(
    ledger: SqlLedger,
) -> None:
    """A client that retries (same key) after a lost or failed answer must not pay twice: the
    error is stored under the key when the mechanism may have run."""
    worker = FakeWorker(BUNDLE, mode="after")
    flow = charging(ledger, worker)
    first, body = run(flow, request(idempotency_key="k9", documents=[{"text": TEXT}]))
    worker.mode = "ok"
    again, again_body = run(flow, request(idempotency_key="k9", documents=[{"text": TEXT}]))
    assert (first.status, again.status) == (500, 500)
    assert again.replayed
    assert again_body == body
    assert worker.calls == 1
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO


def test_a_result_the_gateway_cannot_read_is_settled_final_and_replayed(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker sampled, then building the response failed: the charge is final (not left
    reserved), the key stores the 500, and a retry replays it without a second draw."""
    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)

    def unreadable(*_: object) -> None:
        raise KeyError("a candidate id outside the bundle")

    monkeypatch.setattr(flow, "_released", unreadable)
    first, body = run(flow, request(idempotency_key="k7"))
    assert (first.status, body["error"]["code"]) == (500, "mechanism_failed")
    assert states(ledger) == ["final"]
    monkeypatch.undo()
    again, again_body = run(flow, request(idempotency_key="k7"))
    assert (again.status, again.replayed, again_body) == (500, True, body)
    assert worker.calls == 1
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO


def test_a_failure_before_the_worker_refunds_every_charge_and_frees_the_key(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the worker's request failed after the reservation: nothing was drawn, so the
    charges are refunded (not left reserved) and a retry with the same key runs anew."""
    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)

    def unbuildable(*_: object) -> None:
        raise ValueError("a work item the schema refuses")

    monkeypatch.setattr(flow, "_work", unbuildable)
    first, body = run(flow, request(idempotency_key="k5", documents=[{"text": TEXT}] * 2))
    assert (first.status, body["error"]["code"]) == (500, "internal_error")
    assert body["error"]["message"] == charging_module.NOTHING_DRAWN
    assert body["error"]["charged"] is False
    assert states(ledger) == ["refunded", "refunded"]
    assert ledger.account("acme", "alice").spent_micro == 0
    assert worker.calls == 0
    monkeypatch.undo()
    again, again_body = run(flow, request(idempotency_key="k5", documents=[{"text": TEXT}] * 2))
    assert (again.status, again.replayed) == (200, False), again_body
    assert ledger.account("acme", "alice").spent_micro == 4 * MICRO


def test_a_failed_refund_before_the_worker_never_says_nothing_was_charged(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same failure, and the refund fails too: the charges stay reserved (counted) and
    the answer says they may still count."""
    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)

    def unbuildable(*_: object) -> None:
        raise ValueError("a work item the schema refuses")

    async def ledger_down(*_: object) -> bool:
        return False  # what _settle answers when the ledger failed (logged)

    monkeypatch.setattr(flow, "_work", unbuildable)
    monkeypatch.setattr(flow, "_settle", ledger_down)
    reply, body = run(flow, request(idempotency_key="k8"))
    assert (reply.status, body["error"]["code"]) == (500, "internal_error")
    assert body["error"]["message"] == charging_module.REFUND_FAILED
    assert "charged" not in body["error"]
    assert states(ledger) == ["reserved"]
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO
    assert worker.calls == 0


def test_a_bug_after_the_worker_call_settles_every_charge_as_final(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Code after the worker answered fails (here the refund metric): the worker may have
    drawn, so the charges are final and the failure is stored under the key (a retry replays
    it), never left reserved with the key pending."""
    worker = FakeWorker(BUNDLE, mode="partial")
    flow = charging(ledger, worker)

    real_metric = charging_module.metric

    def broken(name: str) -> object:
        if name == "refunds":
            raise RuntimeError(f"metric {name} is broken")
        return real_metric(name)

    monkeypatch.setattr(charging_module, "metric", broken)
    first, body = run(flow, request(idempotency_key="k4", documents=[{"text": TEXT}] * 2))
    assert (first.status, body["error"]["code"]) == (500, "mechanism_failed")
    assert states(ledger) == ["final", "final"]
    monkeypatch.undo()
    again, again_body = run(flow, request(idempotency_key="k4", documents=[{"text": TEXT}] * 2))
    assert (again.status, again.replayed, again_body) == (500, True, body)
    assert worker.calls == 1


def test_an_unforeseen_failure_is_the_server_s_and_says_the_charge_stands(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug that escapes after the work settled: a 500 internal_error (never a crash out of
    the flow, never the caller's fault), logged with the request's id, and the charge made
    stays made; a retry with the same key replays the stored answer at no charge."""
    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)
    settled = flow.run_and_settle

    async def then_fails(*args: object) -> Reply:
        await settled(*args)  # type: ignore[arg-type]
        raise RuntimeError("an unforeseen bug")

    monkeypatch.setattr(flow, "run_and_settle", then_fails)
    with caplog.at_level("INFO", logger="sentdp.service"):
        first, body = run(flow, request(idempotency_key="k6"))
    assert (first.status, body["error"]["code"]) == (500, "internal_error")
    assert body["error"]["message"] == UNEXPECTED_FAILURE
    assert states(ledger) == ["final"]
    (event,) = logged_events(caplog.records, "charged_request")
    assert (event["status"], event["code"]) == (500, "internal_error")
    assert any(r.exc_info and event["request_id"] in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    again, again_body = run(flow, request(idempotency_key="k6"))
    assert (again.status, again.replayed) == (200, True), again_body
    assert worker.calls == 1
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO


def test_one_unsampled_item_refunds_only_itself(ledger: SqlLedger) -> None:
    worker = FakeWorker(BUNDLE, mode="partial")
    reply, body = run(charging(ledger, worker), request(documents=[{"text": TEXT}] * 3))
    assert reply.status == 503
    assert len(body["error"]["released"]) == 2
    assert states(ledger) == ["refunded", "final", "final"]
    assert ledger.account("acme", "alice").spent_micro == 4 * MICRO
    assert_never_refunded_after_sampling(ledger, worker)


def test_a_retry_with_the_same_key_replays_without_a_second_charge(ledger: SqlLedger) -> None:
    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)
    first, _ = run(flow, request(idempotency_key="k"))
    again, _ = run(flow, request(idempotency_key="k"))
    assert (again.status, again.body, again.replayed) == (200, first.body, True)
    assert worker.calls == 1
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO
    other, body = run(flow, request(idempotency_key="k", epsilon=3.0))
    assert (other.status, body["error"]["code"]) == (422, "idempotency_key_reused")
    # the same request under another API key of the tenant is not a retry of this one
    keyed, body = run(flow, request(idempotency_key="k", caller=caller_secret("second-key")))
    assert (keyed.status, body["error"]["code"]) == (422, "idempotency_key_reused")
    assert "another API key" in body["error"]["message"]
    assert (worker.calls, ledger.account("acme", "alice").spent_micro) == (1, 2 * MICRO)
    assert run(flow, request(idempotency_key="k", user="bob"))[0].status == 200  # per user


def test_past_the_stored_reply_bound_a_request_is_served_and_its_retry_told_so(
    ledger: SqlLedger,
) -> None:
    """A tenant whose stored replies reached SENTDP_TENANT_STORED_REPLY_BYTES is still served
    and charged; a retry of a key whose reply was not kept gets 410 ``reply_not_kept`` at no
    charge, and the worker never runs for it."""
    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)
    flow.limits = replace(flow.limits, tenant_stored_reply_bytes=1)
    served, body = run(flow, request(idempotency_key="k"))
    assert served.status == 200
    assert len(body["documents"]) == 1
    again, again_body = run(flow, request(idempotency_key="k"))
    assert (again.status, again.replayed) == (410, True)
    assert again_body["error"]["code"] == "reply_not_kept"
    assert "SENTDP_TENANT_STORED_REPLY_BYTES" in again_body["error"]["message"]
    assert TEXT.split()[1] not in again.body
    assert worker.calls == 1
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO
    flow.limits = replace(flow.limits, tenant_stored_reply_bytes=10**6)
    kept, _ = run(flow, request(idempotency_key="k2"))
    assert run(flow, request(idempotency_key="k2"))[0].body == kept.body


def test_a_concurrent_duplicate_gets_409(ledger: SqlLedger) -> None:
    gate = asyncio.Event()
    flow = charging(ledger, gated(FakeWorker(BUNDLE), gate))  # type: ignore[arg-type]

    async def both() -> list[Reply]:
        first = asyncio.create_task(flow.handle(request(idempotency_key="same")))
        await asyncio.sleep(0.2)
        second = await flow.handle(request(idempotency_key="same"))
        gate.set()
        return [await first, second]

    first, second = asyncio.run(both())
    assert first.status == 200
    assert second.status == 409
    assert json.loads(second.body)["error"]["code"] == "idempotency_key_in_flight"


@pytest.mark.parametrize(
    ("epsilon", "documents", "key", "status", "code"),
    [
        (math.nan, None, None, 400, "invalid_epsilon"),
        (-1.0, None, None, 400, "invalid_epsilon"),
        (10.5, None, None, 400, "invalid_epsilon"),
        (1e-9, None, None, 400, "invalid_epsilon"),
        (1.0, [{"text": "A."}] * 5, None, 413, "too_many_documents"),
        (1.0, [{"sentences": ["x"] * 11}], None, 413, "document_too_large"),
        (1.0, [{"sentences": ["x"] * 10}] * 3, None, 413, "request_too_large"),
        (1.0, [{"text": "   "}], None, 400, "invalid_document"),
        (1.0, None, "", 400, "invalid_idempotency_key"),
        (1.0, None, "bad\nkey", 400, "invalid_idempotency_key"),
    ],
)
def test_invalid_requests_are_refused_before_anything_is_written(
    ledger: SqlLedger,
    epsilon: float,
    documents: list[dict] | None,
    key: str | None,
    status: int,
    code: str,
) -> None:
    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)
    reply, body = run(flow, request(epsilon=epsilon, documents=documents, idempotency_key=key))
    assert (reply.status, body["error"]["code"]) == (status, code)
    assert ledger.charges() == []
    assert ledger.accounts() == []
    assert worker.calls == 0


def test_a_ledger_that_fails_on_reserve_charges_nothing(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    def broken(*args: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)
    monkeypatch.setattr(ledger, "reserve", broken)
    reply, body = run(flow, request())
    assert (reply.status, body["error"]["code"]) == (503, "ledger_unavailable")
    assert worker.calls == 0
    # a lost connection at COMMIT may have committed: the reply must not promise no charge
    assert "did not run" in body["error"]["message"]
    assert "nothing was charged" not in body["error"]["message"]


def test_a_ledger_that_fails_on_settle_keeps_the_charge_counted(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("connection lost")

    flow = charging(ledger, FakeWorker(BUNDLE))
    monkeypatch.setattr(ledger, "settle", broken)
    reply, _ = run(flow, request())
    assert reply.status == 200  # the embedding was sampled: it is returned
    assert states(ledger) == ["reserved"]  # still counted: over-charge, never under-charge
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO


def test_a_settlement_that_fails_once_is_tried_again_and_a_retry_replays(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transient ledger failure at settlement (a lost connection) no longer leaves the key
    pending: the second attempt completes it, so the client's retry replays, unpaid."""
    monkeypatch.setattr(charging_module, "SETTLE_RETRY_SECONDS", 0.01)
    real = ledger.settle
    failures = [RuntimeError("connection lost")]

    def once(*args: object) -> object:
        if failures:
            raise failures.pop()
        return real(*args)

    calls: list[tuple[object, ...]] = []
    recorded = once

    def once_recorded(*args: object) -> object:
        calls.append(args)
        return recorded(*args)

    flow = charging(ledger, FakeWorker(BUNDLE))
    monkeypatch.setattr(ledger, "settle", once_recorded)
    reply, body = run(flow, request(idempotency_key="k-transient"))
    assert reply.status == 200
    # the second attempt bounds its lock waits; the first waits as any settlement does
    assert [c[-1] for c in calls] == [None, charging_module.SETTLE_RETRY_LOCK_SECONDS]
    assert states(ledger) == ["final"]
    again, again_body = run(flow, request(idempotency_key="k-transient"))
    assert again.replayed
    assert again_body == body
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO  # paid once


def test_a_settlement_whose_answer_was_lost_is_not_counted_twice(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt committed but its answer was lost: the second moves nothing more,
    and the stored reply's bytes are counted once."""
    monkeypatch.setattr(charging_module, "SETTLE_RETRY_SECONDS", 0.01)
    real = ledger.settle
    lost = [RuntimeError("connection lost after COMMIT")]

    def committed_then_lost(*args: object) -> object:
        account = real(*args)
        if lost:
            raise lost.pop()
        return account

    flow = charging(ledger, FakeWorker(BUNDLE))
    monkeypatch.setattr(ledger, "settle", committed_then_lost)
    reply, _ = run(flow, request(idempotency_key="k-lost"))
    assert reply.status == 200
    assert states(ledger) == ["final"]
    assert ledger.stored_reply_bytes("acme") == len(reply.body.encode())
    assert ledger.account("acme", "alice").spent_micro == 2 * MICRO


def test_the_log_holds_no_request_text(
    ledger: SqlLedger, capsys: pytest.CaptureFixture[str]
) -> None:
    from service import logs

    logs.logger.handlers.clear()
    logs.configure()
    marker = "Zanzibar-marker-sentence"
    worker = FakeWorker(BUNDLE, mode="after")
    flow = charging(ledger, worker)
    failing = request(
        user="u-marker", idempotency_key="k-log", documents=[{"text": f"{marker}. Second one."}]
    )
    run(flow, failing)
    run(flow, failing)  # replayed from the stored error
    run(flow, request(user="u-marker", epsilon=50.0, documents=[{"text": marker}]))
    worker.mode = "backlog"
    run(flow, request(user="u-marker", documents=[{"text": marker}]))
    err = capsys.readouterr().err
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    logged = [
        (e["status"], e["code"], e["replayed"])
        for e in events
        if e.get("event") == "charged_request"
    ]
    assert logged == [
        (500, "mechanism_failed", False),
        (500, "mechanism_failed", True),
        (400, "invalid_epsilon", False),
        (429, "tenant_busy", False),
    ]
    assert any("exception" in e for e in events)  # the failure was logged with its traceback
    assert marker not in err
    assert "u-marker" not in err


def test_a_tenant_over_its_in_flight_work_gets_429_and_others_do_not(ledger: SqlLedger) -> None:
    gate = asyncio.Event()
    flow = charging(ledger, gated(FakeWorker(BUNDLE), gate), inflight=24)  # type: ignore[arg-type]
    ten = [{"sentences": [f"s{n}." for n in range(10)]}]

    async def scenario() -> list[Reply]:
        held = asyncio.create_task(flow.handle(request(documents=ten)))
        await asyncio.sleep(0.1)
        busy = await flow.handle(request(user="bob", documents=ten))  # 20 + 20 > 24
        other = asyncio.create_task(flow.handle(request(tenant=PAIRS, documents=ten)))
        await asyncio.sleep(0.1)
        gate.set()
        done = [await held, busy, await other]
        after = await flow.handle(request(user="bob", documents=ten))  # released again
        return [*done, after]

    held, busy, other, after = asyncio.run(scenario())
    assert (held.status, busy.status, other.status, after.status) == (200, 429, 200, 200)
    assert json.loads(busy.body)["error"]["code"] == "tenant_busy"
    assert busy.headers == {"Retry-After": "1"}
    assert ledger.account("acme", "bob").spent_micro == 2 * MICRO  # the 429 charged nothing


def test_a_request_that_cannot_start_in_time_is_refunded(ledger: SqlLedger) -> None:
    inner = FakeWorker(BUNDLE)

    async def queued(work):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.3)  # waits behind other work past its deadline
        return await inner(work)

    flow = charging(ledger, queued, start_timeout=0.1)  # type: ignore[arg-type]
    reply, body = run(flow, request())
    assert reply.status == 503
    assert "deadline" in body["error"]["message"]
    assert states(ledger) == ["refunded"]
    assert inner.journal == []


async def mixed_reply(work: WorkRequest) -> list[WorkResult]:
    """The first item late, the others refused by a worker that refuses to serve."""
    rest = [WorkResult(sampled=False, error=CLOSED_ERROR)] * (len(work.items) - 1)
    return [WorkResult(sampled=False, error=LATE_ERROR), *rest]


def test_a_worker_that_refuses_to_serve_is_refunded_and_marks_the_gateway_not_ready(
    ledger: SqlLedger, caplog: pytest.LogCaptureFixture
) -> None:
    late: list[str] = [LATE_ERROR]

    async def worker(work):  # type: ignore[no-untyped-def]
        return [WorkResult(sampled=False, error=late[0])] * len(work.items)

    flow = charging(ledger, worker)  # type: ignore[arg-type]
    reply, _ = run(flow, request())
    assert (reply.status, flow.worker_closed) == (503, False)  # late is not closed
    mixed = charging(ledger, mixed_reply)  # type: ignore[arg-type]
    reply, _ = run(mixed, request(documents=[{"text": TEXT}] * 2))
    assert (reply.status, mixed.worker_closed) == (503, True)  # any item refused as closed
    late[0] = CLOSED_ERROR
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sentdp.service"):
        for _ in range(2):
            reply, body = run(flow, request())
            assert reply.status == 503
            assert "refuses to serve" in body["error"]["message"]
    assert flow.worker_closed
    assert states(ledger) == ["refunded"] * 5
    events = [r.sentdp_fields["event"] for r in caplog.records if hasattr(r, "sentdp_fields")]
    assert events.count("gateway_not_ready_worker_refusing") == 1


def test_the_worker_deadline_counts_from_arrival_not_from_the_charge(ledger: SqlLedger) -> None:
    """Time spent before the charge (waiting to be checked, checking, reserving) shortens
    the time the worker has to start the request; it never extends it."""
    inner = FakeWorker(BUNDLE)
    deadlines: list[float] = []

    async def recording(work):  # type: ignore[no-untyped-def]
        deadlines.append(work.deadline)
        return await inner(work)

    flow = charging(ledger, recording, start_timeout=5.0)  # type: ignore[arg-type]
    early = request(arrived=time.time() - 4.0)
    reply, _ = run(flow, early)
    assert reply.status == 200
    assert deadlines == [early.arrived + 5.0]
    late, body = run(
        flow,
        request(user="bob", arrived=time.time() - 5.1, arrived_monotonic=time.monotonic() - 5.1),
    )
    assert (late.status, body["error"]["code"]) == (429, "tenant_busy")  # refused at the check
    assert ledger.account("acme", "bob").spent_micro == 0
    assert len(deadlines) == 1


def test_a_request_that_waited_too_long_to_be_checked_is_refused_unchecked(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = charging(ledger, FakeWorker(BUNDLE), start_timeout=0.3)
    checked: list[str] = []
    real_validate = flow.validate

    def slow_validate(req: ChargedRequest):  # type: ignore[no-untyped-def]
        checked.append(req.user)
        time.sleep(0.6)  # the tenant's first request holds its only check slot
        return real_validate(req)

    monkeypatch.setattr(flow, "validate", slow_validate)

    async def scenario() -> list[Reply]:
        return list(await asyncio.gather(flow.handle(request()), flow.handle(request("bob"))))

    first, second = asyncio.run(scenario())
    assert checked == ["alice"]  # bob's request was never split, tokenized or signed
    assert (second.status, json.loads(second.body)["error"]["code"]) == (429, "tenant_busy")
    assert "waited" in json.loads(second.body)["error"]["message"]
    assert ledger.account("acme", "bob").spent_micro == 0
    assert first.status == 503  # alice's 0.6 s check used up her own 0.3 s start timeout
    assert states(ledger) == ["refunded"]


def test_sampled_documents_are_returned_even_when_settling_a_refund_fails(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("connection lost")

    flow = charging(ledger, FakeWorker(BUNDLE, mode="partial"))
    monkeypatch.setattr(ledger, "settle", broken)
    reply, body = run(flow, request(documents=[{"text": TEXT}] * 2))
    assert reply.status == 503
    assert len(body["error"]["released"]) == 1  # the sampled document is not thrown away
    assert states(ledger) == ["reserved", "reserved"]  # both still counted: never under


def test_the_encoding_cost_bounds_a_request_and_a_tenants_work(ledger: SqlLedger) -> None:
    def padded(sentences):  # type: ignore[no-untyped-def]
        return [256 if len(s) > 100 else 16 for s in sentences]

    limits = Limits(4, TextLimits(10, 2000), 20, max_request_tokens=600, tenant_inflight_tokens=600)
    flow = Charging(
        BUNDLE, VERSION, ledger, FakeWorker(BUNDLE), limits, BodySigner(b"k" * 32), padded
    )
    long = ["x" * 150 + ".", "y" * 150 + ".", "z" * 150 + "."]
    ok, _ = run(flow, request(documents=[{"sentences": [*long[:2], "short."]}]))  # 528 + 3
    big, body = run(flow, request(documents=[{"sentences": long}]))  # 768 + 3
    repeated = [{"sentences": [long[0], "short."]}] * 4  # encoded once: 272 + 8, not 1,096
    again, _ = run(flow, request(documents=repeated))
    assert (ok.status, big.status, again.status) == (200, 413, 200)
    assert body["error"]["code"] == "request_too_large"
    assert "771 padded tokens" in body["error"]["message"]
    assert len(ledger.charges()) == 5  # one per document of the two admitted requests


def test_a_repeated_sentence_is_encoded_once_but_every_row_still_costs() -> None:
    def eight(sentences):  # type: ignore[no-untyped-def]
        return [8] * len(sentences)

    assert work_cost([["word."] * 1000], eight) == 8 + 1000
    assert work_cost([["a.", "b."], ["a.", "c."]], eight) == 3 * 8 + 4


def test_a_tenant_checks_a_few_requests_at_once_and_queues_a_bounded_number(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking (splitting, tokenizing, signing) is CPU work done before anything is
    charged: a tenant gets ``tenant_checks`` of the checking threads at once and a bounded
    queue; another tenant's request is checked beside them, not after them. A cancelled
    request keeps its slot until its check has run, so disconnecting frees no CPU."""
    flow = charging(ledger, FakeWorker(BUNDLE))
    flow.checks = TenantChecks(running=2, waiting=1)
    release = threading.Event()
    running: list[str] = []
    most = [0]
    real_validate = flow.validate

    def held_validate(req: ChargedRequest):  # type: ignore[no-untyped-def]
        running.append(req.tenant.id)
        most[0] = max(most[0], running.count("acme"))
        if req.tenant.id == "acme":
            release.wait(10)
        try:
            return real_validate(req)
        finally:
            running.remove(req.tenant.id)

    monkeypatch.setattr(flow, "validate", held_validate)

    async def scenario() -> tuple[list[Reply], Reply, Reply]:
        first = [asyncio.create_task(flow.handle(request(user=f"u{n}"))) for n in range(3)]
        await asyncio.sleep(0.2)
        assert running.count("acme") == 2  # two checking, one waiting
        refused = await flow.handle(request(user="u3"))  # the queue is full: no check at all
        other = await flow.handle(request(tenant=PAIRS))  # checked while acme's are held
        first[0].cancel()  # its check keeps running, and keeps its slot
        await asyncio.sleep(0.2)
        assert running.count("acme") == 2
        assert flow.checks.in_queue("acme") == 3
        release.set()
        done = await asyncio.gather(*first[1:])
        return list(done), refused, other

    done, refused, other = asyncio.run(scenario())
    assert [r.status for r in done] == [200, 200]
    assert (refused.status, json.loads(refused.body)["error"]["code"]) == (429, "tenant_busy")
    assert refused.headers == {"Retry-After": "1"}
    assert other.status == 200
    assert most[0] == 2
    assert flow.checks.in_queue("acme") == 0
    assert ledger.account("acme", "u3").spent_micro == 0
    assert ledger.account("acme", "u0").spent_micro == 0  # cancelled before it was charged


def test_free_reads_run_one_per_tenant_on_their_own_threads(ledger: SqlLedger) -> None:
    """A flood of one tenant's reads (label lookups, /budget) waits behind itself, not in front
    of another tenant's reads; past the waiting limit it is refused, before any work."""
    flow = charging(ledger, FakeWorker(BUNDLE))
    probe = Concurrency()
    most = probe.most
    threads: set[str] = set()
    order: list[str] = []

    def slow_read(tenant: str, name: str) -> str:
        with probe.counting(tenant):
            threads.add(threading.current_thread().name)
            time.sleep(0.05)
            order.append(name)
        return name

    async def scenario() -> list[object]:
        flood = [
            asyncio.create_task(flow.read("a", slow_read, "a", f"a{n}"))
            for n in range(charging_module.READS_WAITING + 2)
        ]
        await asyncio.sleep(0.01)
        other = await flow.read("b", slow_read, "b", "b0")
        return [other, *await asyncio.gather(*flood, return_exceptions=True)]

    other, *flood = asyncio.run(scenario())
    assert other == "b0"
    assert order.index("b0") <= 2  # not behind a's queue
    assert (most["a"], most["b"]) == (1, 1)
    assert threads <= {f"sentdp-read_{n}" for n in range(charging_module.READ_THREADS)}
    refused = [r for r in flood if isinstance(r, ApiError)]
    assert len(refused) == 1  # one running and READS_WAITING waiting were let in
    assert refused[0].code == "tenant_busy"
    assert not flow.reads.in_queue("a")


def test_ledger_calls_run_on_the_ledgers_own_threads(ledger: SqlLedger) -> None:
    flow = charging(ledger, FakeWorker(BUNDLE))
    seen: list[str] = []
    reserve = ledger.reserve

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)
        return reserve(*args, **kwargs)

    ledger.reserve = recorded  # type: ignore[method-assign]
    reply, _ = run(flow, request())
    assert reply.status == 200
    assert seen
    assert all(name.startswith("sentdp-ledger") for name in seen)


def test_a_tenants_backlog_of_ledger_calls_does_not_hold_back_another_tenant(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one ledger thread busy with acme's first reservation and four more of acme's
    waiting, the other tenant's reservation is the second to run, not the sixth."""
    import service.charging as charging_module

    monkeypatch.setattr(charging_module, "LEDGER_THREADS", 1)
    flow = charging(ledger, FakeWorker(BUNDLE), inflight=1000)
    release = threading.Event()
    reserved: list[str] = []
    real_reserve = ledger.reserve

    def reserve(tenant: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not reserved:
            release.wait(10)  # the first call holds the only thread
        reserved.append(tenant)
        return real_reserve(tenant, *args, **kwargs)

    monkeypatch.setattr(ledger, "reserve", reserve)

    async def scenario() -> list[Reply]:
        tasks = [asyncio.create_task(flow.handle(request(user=f"a{n}"))) for n in range(5)]
        await until(lambda: flow._ledger_calls.waiting() == 4)  # acme's first runs, four wait
        tasks.append(asyncio.create_task(flow.handle(request(user="p", tenant=PAIRS))))
        await until(lambda: flow._ledger_calls.waiting() == 5)
        release.set()
        return await asyncio.gather(*tasks)

    replies = asyncio.run(scenario())
    assert [r.status for r in replies] == [200] * 6
    assert reserved[:3] == ["acme", "acme", "pairs"]


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` on the event loop; fail (not hang) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.005)


def test_a_settlement_runs_even_when_its_request_is_cancelled_while_it_waits(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker sampled; the client goes away while the settlement waits for a ledger
    thread: the settlement still runs, so the charge is final and the key holds the reply
    (cancelled, it would leave the charge reserved and the key pending)."""
    import service.charging as charging_module

    monkeypatch.setattr(charging_module, "LEDGER_THREADS", 1)
    worker = FakeWorker(BUNDLE)
    gate = asyncio.Event()
    flow = charging(ledger, gated(worker, gate))  # type: ignore[arg-type]
    release = threading.Event()

    async def scenario() -> None:
        task = asyncio.create_task(flow.handle(request(idempotency_key="k-cancelled")))
        await until(lambda: states(ledger) == ["reserved"])  # reserved, at the worker
        blocker = flow._ledger_calls.submit("other", release.wait, 10)  # the only thread
        await until(lambda: flow._ledger_calls.waiting() == 0)  # taken: it runs
        gate.set()
        await until(lambda: flow._ledger_calls.waiting() == 1)  # the settlement waits
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await asyncio.wrap_future(blocker)
        await until(lambda: states(ledger) == ["final"])

    asyncio.run(scenario())
    assert len(worker.journal) == 1
    replayed, _ = run(flow, request(idempotency_key="k-cancelled"))
    assert (replayed.status, replayed.replayed) == (200, True)


def test_sqlite_gets_one_ledger_thread_and_postgresql_eight_four_per_tenant(
    ledger: SqlLedger,
) -> None:
    """SQLite writes one transaction at a time (more threads only race for its lock)."""
    from service.ledger.postgres import PostgresLedger

    flow = charging(ledger, FakeWorker(BUNDLE))
    assert (flow._ledger_calls._pool._max_workers, flow._ledger_calls.per_key) == (1, 1)
    assert PostgresLedger.parallel_writes
    ledger.parallel_writes = True  # as a PostgreSQL ledger says
    parallel = charging(ledger, FakeWorker(BUNDLE))
    assert (parallel._ledger_calls._pool._max_workers, parallel._ledger_calls.per_key) == (8, 4)


def test_a_reservation_whose_request_is_cancelled_while_it_runs_is_refunded(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client goes away while its reservation is being written: the worker never runs,
    so once the reservation ends its charge is refunded and the Idempotency-Key released (a
    retry with the key runs afresh). Cancelled before it starts, it never reserves."""
    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)
    started = threading.Event()
    release = threading.Event()
    real_reserve = ledger.reserve

    def reserve(*args, **kwargs):  # type: ignore[no-untyped-def]
        started.set()
        release.wait(10)
        return real_reserve(*args, **kwargs)

    monkeypatch.setattr(ledger, "reserve", reserve)

    async def scenario() -> None:
        task = asyncio.create_task(flow.handle(request(idempotency_key="k-gone")))
        await until(started.is_set)  # the reservation runs on the ledger's thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await until(lambda: states(ledger) == ["refunded"])

    asyncio.run(scenario())
    assert worker.calls == 0
    monkeypatch.setattr(ledger, "reserve", real_reserve)
    retried, _ = run(flow, request(idempotency_key="k-gone"))
    assert (retried.status, retried.replayed) == (200, False)
    assert states(ledger) == ["refunded", "final"]


def test_a_settlement_that_fails_after_its_request_was_cancelled_is_logged(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import service.charging as charging_module

    monkeypatch.setattr(charging_module, "LEDGER_THREADS", 1)
    worker = FakeWorker(BUNDLE)
    gate = asyncio.Event()
    flow = charging(ledger, gated(worker, gate))  # type: ignore[arg-type]
    release = threading.Event()

    def broken_settle(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("the database went away")

    req = request()

    async def scenario() -> None:
        task = asyncio.create_task(flow.handle(req))
        await until(lambda: states(ledger) == ["reserved"])
        blocker = flow._ledger_calls.submit("other", release.wait, 10)
        await until(lambda: flow._ledger_calls.waiting() == 0)
        monkeypatch.setattr(ledger, "settle", broken_settle)
        gate.set()
        await until(lambda: flow._ledger_calls.waiting() == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await asyncio.wrap_future(blocker)
        await until(lambda: "the database went away" in caplog.text)

    with caplog.at_level("ERROR", logger="sentdp.service"):
        asyncio.run(scenario())
    assert f"ledger settle failed (request {req.request_id})" in caplog.text
    assert states(ledger) == ["reserved"]  # still counted: an over-charge, never an under-charge


def test_a_reservation_cancelled_before_it_starts_never_runs_and_budget_reads_take_turns(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ledger thread, busy: a request cancelled while its reservation waits never
    reserves; a budget read of another tenant runs in its own turn, not after all of acme's
    queued calls."""
    import service.charging as charging_module

    monkeypatch.setattr(charging_module, "LEDGER_THREADS", 1)
    flow = charging(ledger, FakeWorker(BUNDLE))
    release = threading.Event()
    order: list[str] = []
    reserved: list[str] = []
    real_reserve = ledger.reserve

    def reserve(*args, **kwargs):  # type: ignore[no-untyped-def]
        reserved.append(args[1])
        return real_reserve(*args, **kwargs)

    monkeypatch.setattr(ledger, "reserve", reserve)

    async def scenario() -> None:
        blocker = flow._ledger_calls.submit("other", release.wait, 10)
        await until(lambda: flow._ledger_calls.waiting() == 0)
        task = asyncio.create_task(flow.handle(request(user="gone")))
        await until(lambda: flow._ledger_calls.waiting() == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        queued = [flow._ledger_calls.submit("acme", order.append, f"acme {n}") for n in range(3)]
        read = asyncio.create_task(flow.read("pairs", order.append, "pairs", ledger=True))
        await until(lambda: flow._ledger_calls.waiting() == 5)  # the cancelled one, 3, 1
        release.set()
        await asyncio.wrap_future(blocker)
        await read
        for future in queued:
            await asyncio.wrap_future(future)

    asyncio.run(scenario())
    assert reserved == []  # the cancelled request's reservation never ran
    assert states(ledger) == []
    # the cancelled reservation was acme's first call in turn; skipped, it used acme's turn
    assert order == ["pairs", "acme 0", "acme 1", "acme 2"]


@pytest.mark.parametrize("mode", ["ok", "backlog"])
def test_a_request_cancelled_while_the_worker_runs_is_settled_when_the_worker_answers(
    ledger: SqlLedger, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The client goes away while the worker runs: the work goes on to its settlement. What
    was sampled is charged and its reply replays under the key; what was not is refunded
    and the key is free. The tenant's load stays taken until the worker has answered, so
    leaving early never lets a tenant put more work in flight than its limit."""
    worker = FakeWorker(BUNDLE, mode=mode)
    gate = asyncio.Event()
    probe = charging(ledger, worker)
    one = probe.load.weight(probe.validate(request()).cost)
    flow = charging(ledger, gated(worker, gate), inflight=one)  # room for one such request

    async def scenario() -> None:
        task = asyncio.create_task(flow.handle(request(idempotency_key="k-left")))
        await until(lambda: len(flow._settling) == 1)  # reserved, at the worker
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        assert states(ledger) == ["reserved"]
        busy = await flow.handle(request(user="bob"))  # the tenant's load is still taken
        assert (busy.status, busy.code) == (429, "tenant_busy")
        gate.set()
        await until(lambda: states(ledger) != ["reserved"])
        assert await flow.drain(5) == 0
        assert not flow.load._inflight  # given back once the work ended

    with caplog.at_level("INFO", logger="sentdp.service"):
        asyncio.run(scenario())
    ended = logged_events(caplog.records, "charged_request_ended_after_cancel")
    assert len(ended) == 1
    assert ended[0]["outcome"] == "answered"
    assert ended[0]["status"] == (200 if mode == "ok" else 429)
    assert ended[0]["documents"] == 1
    assert not {"text", "sentences"} & set(ended[0])
    again, _ = run(flow, request(idempotency_key="k-left"))
    if mode == "ok":
        assert states(ledger)[0] == "final"
        assert (again.status, again.replayed) == (200, True)  # charged once, replayed
    else:
        assert states(ledger) == ["refunded", "refunded"]  # nothing drawn, either time
        assert (again.status, again.replayed) == (429, False)  # the key was free: ran afresh


def test_a_request_cancelled_while_a_worker_that_never_answers_runs_stays_charged(
    ledger: SqlLedger,
) -> None:
    """The worker has sampled and never answers: nothing may refund that charge (it stays
    reserved, counted, until an operator or the pending timeout settles the key)."""
    worker = FakeWorker(BUNDLE)
    sampled = asyncio.Event()

    async def samples_then_hangs(work: WorkRequest) -> list:  # type: ignore[type-arg]
        results = await worker(work)
        sampled.set()
        await asyncio.Event().wait()  # until cancelled
        return results

    flow = charging(ledger, samples_then_hangs)  # type: ignore[arg-type]

    async def scenario() -> None:
        task = asyncio.create_task(flow.handle(request(idempotency_key="k-sampled")))
        await asyncio.wait_for(sampled.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)  # anything scheduled after the cancel has run

    asyncio.run(scenario())
    assert len(worker.journal) == 1
    assert states(ledger) == ["reserved"]
    assert ledger.account("acme", "alice").spent_micro > 0


def test_a_stopping_gateway_waits_for_cancelled_work_and_reports_what_it_left(
    ledger: SqlLedger, caplog: pytest.LogCaptureFixture
) -> None:
    """``drain`` (the gateway's shutdown hook) returns when reserved work whose request was
    cancelled has settled, and after its time limit names what is still running: cancelled
    with the event loop, that work's charges stay reserved, which counts them."""
    from service.gateway import Gateway

    assert Gateway.inner._settle_before_stopping.__bentoml_shutdown_hook__  # type: ignore[attr-defined]
    worker = FakeWorker(BUNDLE)
    gate = asyncio.Event()
    flow = charging(ledger, gated(worker, gate))  # type: ignore[arg-type]

    async def never_answers(work: WorkRequest) -> list:  # type: ignore[type-arg]
        await asyncio.Event().wait()
        return []

    hung = charging(ledger, never_answers)  # type: ignore[arg-type]
    cut = request(user="cut")

    async def cancelled_at_the_worker(on: Charging, req: ChargedRequest) -> None:
        task = asyncio.create_task(on.handle(req))
        await until(lambda: len(on._settling) == 1)  # reserved, at the worker
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def waits() -> tuple[int, int]:
        await cancelled_at_the_worker(flow, request(user="waited"))
        left = await flow.drain(0.1)  # the worker has not answered
        gate.set()
        return left, await flow.drain(5)

    async def stops() -> int:
        await cancelled_at_the_worker(hung, cut)
        return await hung.drain(0.1)  # then the loop ends, cancelling the work

    with caplog.at_level("INFO", logger="sentdp.service"):
        assert asyncio.run(waits()) == (1, 0)
        assert states(ledger) == ["final"]
        assert asyncio.run(stops()) == 1
    assert states(ledger) == ["final", "reserved"]
    left = logged_events(caplog.records, "charged_work_left_at_shutdown")
    assert left[-1]["request_ids"] == [cut.request_id]
    ended = logged_events(caplog.records, "charged_request_ended_after_cancel")
    assert [f["outcome"] for f in ended] == ["answered", "cancelled"]
    assert not flow._settling
    assert not hung._settling


def test_a_worker_call_ends_before_its_keys_pending_window_does(ledger: SqlLedger) -> None:
    """A worker that never answers is given up at 0.9 of the key's pending window, counted
    from the request's arrival: a retry meanwhile gets 409 (in flight), never a second
    sampling; after it the error is stored under the key (the outcome is unknown, so the
    charge is final) and replays."""
    ledger.pending_timeout = 2.0
    calls: list[int] = []

    async def never_answers(work: WorkRequest) -> list:  # type: ignore[type-arg]
        calls.append(1)
        await asyncio.Event().wait()
        return []

    flow = charging(ledger, never_answers)  # type: ignore[arg-type]
    first = request(idempotency_key="k-hung")

    async def scenario() -> tuple[Reply, Reply, float]:
        task = asyncio.create_task(flow.handle(first))
        await until(lambda: calls == [1])
        retried = await flow.handle(request(idempotency_key="k-hung"))
        reply = await task
        return reply, retried, time.monotonic() - first.arrived_monotonic

    reply, retried, seconds = asyncio.run(scenario())
    assert retried.status == 409
    assert 1.0 < seconds < 2.0  # given up at 1.8 s, inside the 2 s window
    assert (reply.status, reply.code) == (502, "worker_response_lost")
    assert states(ledger) == ["final"]
    again, _ = run(flow, request(idempotency_key="k-hung"))
    assert (again.status, again.replayed) == (502, True)
    assert calls == [1]


def test_a_wall_clock_step_does_not_move_the_worker_calls_end(ledger: SqlLedger) -> None:
    """The worker call's end counts from the arrival on the monotonic clock: when the wall
    clock steps back after the arrival (here the arrival reads 1 s ahead of now), the call is
    still given up at 1.8 s of a 2 s pending window, not at 2.8 s, after the key's window
    (a retry could then take the key over and sample again)."""
    ledger.pending_timeout = 2.0

    async def never_answers(work: WorkRequest) -> list:  # type: ignore[type-arg]
        await asyncio.Event().wait()
        return []

    flow = charging(ledger, never_answers)  # type: ignore[arg-type]
    stepped = request(arrived=time.time() + 1.0)
    reply = asyncio.run(flow.handle(stepped))
    seconds = time.monotonic() - stepped.arrived_monotonic
    assert (reply.status, reply.code) == (502, "worker_response_lost")
    assert 1.0 < seconds < 2.0


def test_an_abandoned_reservations_refund_leaves_a_key_another_request_took_over(
    ledger: SqlLedger,
) -> None:
    """Request A's reservation ends after A was cancelled, so it is refunded; meanwhile B
    took A's abandoned key over and stored its reply. The refund moves A's charge only: B's
    reply still replays, and B's work is not run or charged again."""

    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)
    req_a = request(idempotency_key="k-taken")
    admission = flow.validate(req_a)
    reserved = ledger.reserve(
        "acme", "alice", admission.charge, ACME.policy, req_a.request_id, admission.key
    )
    age_pending_keys(ledger, 10_000)  # A's key is abandoned
    taken, _ = run(flow, request(idempotency_key="k-taken"))
    assert (taken.status, taken.replayed) == (200, False)
    flow._refund_abandoned(req_a, admission, reserved)
    wait_for(lambda: states(ledger) == ["refunded", "final"], timeout=10)
    replayed, _ = run(flow, request(idempotency_key="k-taken"))
    assert (replayed.status, replayed.replayed) == (200, True)
    assert worker.calls == 1


def test_an_abandoned_replay_refunds_nothing(ledger: SqlLedger) -> None:
    """A cancelled request whose reservation found its key completed (a replay) charged
    nothing, so nothing is refunded: the stored charge stays final and its reply replays."""
    from service.ledger import Replay

    worker = FakeWorker(BUNDLE)
    flow = charging(ledger, worker)
    first, _ = run(flow, request(idempotency_key="k-done"))
    assert first.status == 200
    req = request(idempotency_key="k-done")
    flow._refund_abandoned(req, flow.validate(req), Replay(first.body, 200))
    assert flow._ledger_calls.waiting() == 0
    time.sleep(0.1)
    assert states(ledger) == ["final"]
    replayed, _ = run(flow, request(idempotency_key="k-done"))
    assert (replayed.status, replayed.replayed) == (200, True)
    assert worker.calls == 1
