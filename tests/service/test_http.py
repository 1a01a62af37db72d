"""The service over real HTTP: a `bentoml serve` process with a --quick bundle on loopback."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from sentdp.bundle import Bundle
from service.worker_client import DISPATCHER_TRAINING_CALLS
from tests.support import (
    METRICS_TOKEN,
    TENANTS,
    TEXT,
    Server,
    client,
    error_of,
    ledger_of,
    privatize,
    read_journal,
)

pytestmark = pytest.mark.server

ACME, OTHER, TINY, ZERO = TENANTS


@pytest.fixture(scope="module")
def bundle(server: Server, bentoml_home: Path) -> Bundle:
    import bentoml

    return Bundle.load(Path(bentoml.models.get(server.env["SENTDP_MODEL"]).path))


def test_privatize_returns_a_candidate_of_the_bundle_and_charges_once(server, bundle) -> None:
    response = privatize(server, "p-user", epsilon=2.5)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == server.env["SENTDP_MODEL"]
    (document,) = body["documents"]
    variant, local = bundle.locate(document["candidate"])
    np.testing.assert_array_equal(document["embedding"], variant.candidates[local])
    choice = bundle.manifest.choice_for(2.5)
    assert (document["variant"], document["p"]) == (choice.variant, choice.p)
    assert variant.record.name == choice.variant
    assert document["k"] == 4
    assert document["epsilon"] == 2.5
    assert body["budget"] == {
        "user": "p-user",
        "spent_epsilon": 2.5,
        "group_size": 1,
        "group_epsilon": 2.5,
        "limit": 100.0,
        "remaining": 97.5,
        "remaining_epsilon": 97.5,
        "documents": 1,
        "period": 0,
        "accounting": "pure",
        "composition": "sequential",
        "spend": 2.5,
        "spend_limit": 100.0,
        "spend_unit": "epsilon",
    }
    assert ledger_of(server).account("acme", "p-user").spent_micro == 2_500_000


def test_presplit_sentences_and_several_documents(server) -> None:
    documents = [
        {"sentences": ["One.", "Two.", "Three."]},
        {"text": TEXT},
        {"sentences": ["Solo."]},
    ]
    response = privatize(server, "multi", epsilon=1.0, documents=documents)
    assert response.status_code == 200, response.text
    assert [d["k"] for d in response.json()["documents"]] == [3, 4, 1]
    assert response.json()["budget"]["spent_epsilon"] == 3.0


def _classify(server, user: str, epsilon: float):  # type: ignore[no-untyped-def]
    with client(server, ACME.key) as http:
        return http.post(
            "/classify", json={"user": user, "epsilon": epsilon, "documents": [{"text": TEXT}]}
        )


def test_classify_labels_as_the_bundle_s_table_says_and_lookup_is_free(server, bundle) -> None:
    for choice in bundle.manifest.p_table:
        classified = _classify(server, f"c-user-{choice.epsilon:g}", choice.epsilon)
        assert classified.status_code == 200, classified.text
        (document,) = classified.json()["documents"]
        assert classified.json()["budget"]["spent_epsilon"] == choice.epsilon
        if choice.label == "vote":
            assert document["label_mechanism"] == "sentence-vote"
            assert document["label"] in bundle.labels
            assert set(document) == {"label", "label_mechanism", "k", "epsilon"}
            continue
        assert document["label_mechanism"] == "candidate"
        variant, local = bundle.locate(document["candidate"])
        probabilities = variant.candidate_class_probs[local]
        assert document["label"] == bundle.labels[int(probabilities.argmax())]
        assert math.isclose(sum(document["probabilities"].values()), 1.0, rel_tol=1e-9)
        with client(server, ACME.key) as http:
            lookup = http.post(
                "/classify",
                json={"model": server.env["SENTDP_MODEL"], "candidates": [document["candidate"]]},
            )
            assert lookup.status_code == 200, lookup.text
            assert lookup.json()["labels"][0]["label"] == document["label"]
            # the version the charged reply named (an alias resolved), and no null fields
            assert lookup.json()["model"] == classified.json()["model"]
            assert set(lookup.json()) == {"model", "labels"}
            budget = http.post("/budget", json={"user": f"c-user-{choice.epsilon:g}"}).json()
        assert budget["spent_epsilon"] == choice.epsilon  # the lookup cost nothing


def test_budget_endpoint_reports_group_cost(server) -> None:
    privatize(server, "g-user", epsilon=2.0, key=OTHER.key)
    with client(server, OTHER.key) as http:
        budget = http.post("/budget", json={"user": "g-user"}).json()
    assert {name: value for name, value in budget.items() if value is not None} == {
        "user": "g-user",
        "spent_epsilon": 2.0,
        "group_size": 2,
        "group_epsilon": 4.0,
        "limit": 20.0,
        "remaining": 16.0,
        "remaining_epsilon": 8.0,
        "documents": 1,
        "period": 0,
        "accounting": "pure",
        "composition": "sequential",
        "spend": 4.0,
        "spend_limit": 20.0,
        "spend_unit": "epsilon",
    }


def test_idempotent_retry_replays_without_charging_and_other_body_is_422(server) -> None:
    headers = {"Idempotency-Key": "retry-1"}
    payload = {"user": "i-user", "epsilon": 1.0, "documents": [{"text": TEXT}]}
    with client(server, ACME.key) as http:
        first = http.post("/privatize", json=payload, headers=headers)
        second = http.post("/privatize", json=payload, headers=headers)
        changed = http.post("/privatize", json={**payload, "epsilon": 2.0}, headers=headers)
        budget = http.post("/budget", json={"user": "i-user"}).json()
    assert first.status_code == second.status_code == 200
    assert second.json() == first.json()
    assert second.headers["idempotent-replayed"] == "true"
    assert changed.status_code == 422
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    assert budget["spent_epsilon"] == 1.0


def test_concurrent_duplicates_of_one_key_are_charged_once(server) -> None:
    payload = {"user": "dup-user", "epsilon": 1.0, "documents": [{"text": TEXT}]}

    def send(_: int) -> int:
        with client(server, ACME.key) as http:
            return http.post(
                "/privatize", json=payload, headers={"Idempotency-Key": "dup"}
            ).status_code

    with ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(send, range(6)))
    assert set(statuses) <= {200, 409}
    assert 200 in statuses
    assert ledger_of(server).account("acme", "dup-user").spent_micro == 1_000_000


REFUSED = [
    ({"epsilon": float("nan")}, 400, "invalid_epsilon"),
    ({"epsilon": 0.0}, 400, "invalid_epsilon"),
    ({"epsilon": -1.0}, 400, "invalid_epsilon"),
    ({"epsilon": 10.5}, 400, "invalid_epsilon"),
    ({"epsilon": 1e308}, 400, "invalid_epsilon"),
    ({"documents": []}, 400, "invalid_body"),
    ({"documents": [{"text": "   "}]}, 400, "invalid_document"),
    ({"documents": [{"text": "x", "sentences": ["y"]}]}, 400, "invalid_body"),
    ({"documents": [{"sentences": ["ok", ""]}]}, 400, "invalid_document"),
    ({"documents": [{"sentences": ["w"] * 41}]}, 413, "document_too_large"),
    ({"documents": [{"text": "A."}] * 5}, 413, "too_many_documents"),
    ({"user": ""}, 400, "invalid_body"),
    ({"extra": 1}, 400, "invalid_body"),
]


@pytest.mark.parametrize(("change", "status", "code"), REFUSED)
def test_bad_input_is_refused_with_a_clear_error_and_no_charge(
    server, change, status, code
) -> None:
    before = ledger_of(server).charges()
    payload = {"user": "bad-user", "epsilon": 1.0, "documents": [{"text": TEXT}], **change}
    with client(server, ACME.key) as http:
        response = http.post(
            "/privatize",
            content=json.dumps(payload, allow_nan=True),
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["code"] == code
    assert error["message"]
    assert "IODescriptor" not in error["message"]  # no name of BentoML's internal classes
    assert ledger_of(server).charges() == before


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"user": "u", "epsilon": 1, "documents": [{"text": "\xff\xfe"}]}',
        b"",
        b"[" * 10_000 + b"]" * 10_000,
        b'{"user": "u", "epsilon": Infinity, "documents": []}',
    ],
)
def test_malformed_bodies_get_400_not_500(server, body: bytes) -> None:
    with client(server, ACME.key) as http:
        response = http.post(
            "/privatize", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "invalid_body"


@pytest.mark.parametrize(
    "content_type", ["multipart/form-data", "text/plain", "application/x-www-form-urlencoded"]
)
def test_bodies_that_are_not_json_get_415(server, content_type: str) -> None:
    with client(server, ACME.key) as http:
        response = http.post(
            "/privatize", content=b'{"user": "u"}', headers={"Content-Type": content_type}
        )
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"


def test_a_huge_body_gets_413(server) -> None:
    with client(server, ACME.key) as http:
        response = http.post(
            "/privatize", json={"user": "u", "epsilon": 1, "documents": [{"text": "a" * 70_000}]}
        )
    assert response.status_code == 413
    assert error_of(response)["code"] == "body_too_large"


@pytest.mark.parametrize("header", [None, "Bearer wrong-key", "Basic abc", "Bearer"])
def test_missing_or_wrong_keys_get_401(server, header) -> None:
    with client(server, None) as http:
        headers = {} if header is None else {"Authorization": header}
        for path in ("/privatize", "/classify", "/budget"):
            response = http.post(path, json={"user": "u"}, headers=headers)
            assert response.status_code == 401
            assert error_of(response)["code"] == "unauthorized"


def test_budget_exhaustion_is_402_with_a_typed_body(server) -> None:
    for _ in range(2):
        assert privatize(server, "x-user", epsilon=4.0, key=OTHER.key).status_code == 200
    refused = privatize(server, "x-user", epsilon=4.0, key=OTHER.key)  # 2 * (8 + 4) > 20
    assert refused.status_code == 402
    error = error_of(refused)
    assert error["code"] == "budget_exhausted"
    assert {
        k: error[k] for k in ("requested", "spent_epsilon", "group_size", "limit", "remaining")
    } == {
        "requested": 4.0,
        "spent_epsilon": 8.0,
        "group_size": 2,
        "limit": 20.0,
        "remaining": 4.0,
    }
    exact = privatize(server, "x-user", epsilon=2.0, key=OTHER.key)  # 2 * (8 + 2) == 20
    assert exact.status_code == 200
    assert exact.json()["budget"]["remaining"] == 0.0


def test_tenants_cannot_see_or_spend_each_others_users(server) -> None:
    assert privatize(server, "shared-name", epsilon=3.0).status_code == 200
    with client(server, OTHER.key) as http:
        other_view = http.post("/budget", json={"user": "shared-name"}).json()
    with client(server, ACME.key) as http:
        acme_view = http.post("/budget", json={"user": "shared-name"}).json()
    assert other_view["spent_epsilon"] == 0.0
    assert acme_view["spent_epsilon"] == 3.0


def test_unknown_model_version_is_404(server) -> None:
    with client(server, ACME.key) as http:
        for model in ("sentdp-test:nope", "other-model:latest", "::"):
            response = http.post("/classify", json={"model": model, "candidates": [0]})
            assert response.status_code == 404, response.text
            assert error_of(response)["code"] == "unknown_model"
        bad_id = http.post(
            "/classify", json={"model": server.env["SENTDP_MODEL"], "candidates": [10**6]}
        )
    assert bad_id.status_code == 400


def test_ledger_invariant_and_journal_after_all_of_the_above(server) -> None:
    ledger = ledger_of(server)
    charges = ledger.charges()
    journal = read_journal(Path(server.env["SENTDP_SAMPLE_JOURNAL"]))
    assert not {c["id"] for c in charges if c["state"] == "refunded"} & journal
    for account in ledger.accounts():
        counted = sum(
            c["micro"]
            for c in charges
            if (c["tenant"], c["user"]) == (account.tenant, account.user)
            and c["state"] != "refunded"
        )
        assert account.spent_micro == counted


def test_metrics_need_the_metrics_token_and_openapi_is_served(server) -> None:
    privatize(server, "m-user")
    with client(server, None) as http:
        assert http.get("/metrics").status_code == 401
        spec = http.get("/docs.json").json()
        assert http.get("/healthz").status_code == 200
    with client(server, ACME.key) as http:
        assert http.get("/metrics").status_code == 401  # a tenant's key is not the token
    with client(server, METRICS_TOKEN) as http:
        metrics = http.get("/metrics").text
    for name in (
        "sentdp_documents_privatized_total",
        "sentdp_epsilon_requested_bucket",
        "sentdp_budget_refusals_total",
        "sentdp_ledger_seconds_bucket",
        "sentdp_worker_batch_documents_bucket",
        "sentdp_charged_request_seconds_bucket",
    ):
        assert name in metrics, name
    assert {"/privatize", "/classify", "/budget"} <= set(spec["paths"])


@pytest.mark.parametrize(
    "body",
    [
        {"user": "u", "documents": [{"text": "A. B."}]},
        {"user": "u", "epsilon": 1.0, "documents": [{"text": "A. B."}], "candidates": [0]},
        {"model": "sentdp-test:latest"},
        {},
        # a field of the other form is refused, not ignored (a trial charged these, or served
        # a lookup that dropped user and epsilon)
        {"user": "u", "epsilon": 1.0, "documents": [{"text": "A. B."}], "model": "other:v9"},
        {"model": "sentdp-test:latest", "candidates": [0], "user": "u"},
        {"model": "sentdp-test:latest", "candidates": [0], "epsilon": 1.0},
    ],
)
def test_classify_needs_one_complete_form(server, body) -> None:
    before = ledger_of(server).charges()
    with client(server, ACME.key) as http:
        response = http.post("/classify", json=body)
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "invalid_body"
    assert ledger_of(server).charges() == before


def test_requests_with_many_sentences_bypass_adaptive_batching(server) -> None:
    assert server.log is not None
    documents = [{"sentences": [f"Sentence {d}.{n} is here." for n in range(40)]} for d in range(4)]
    response = privatize(server, "big-user", epsilon=1.0, documents=documents)
    assert response.status_code == 200, response.text
    assert [d["k"] for d in response.json()["documents"]] == [40, 40, 40, 40]
    assert "path=/worker/privatize_unbatched" in server.log.read_text()  # 160 > 100 sentences


def test_readyz_answers_503_at_once_while_the_worker_starts_never_hangs(server) -> None:
    """The server's start-up, as its fixture probed it: /readyz said 503 until the worker
    was up (BentoML's own probe held it up to the 150 s request timeout), then 200."""
    statuses = [status for status, _ in server.probes]
    assert statuses[-1] == 200
    assert set(statuses) <= {200, 503}, server.probes
    assert 503 in statuses, server.probes
    assert max(seconds for _, seconds in server.probes) < 15, server.probes


def test_readiness_waits_for_the_worker_dispatcher_warm_up(server) -> None:
    """Before /readyz first said 200, the gateway trained the worker's batching dispatcher
    on empty calls, all answered (service.worker_client.warm_dispatcher)."""
    assert server.log is not None
    events = [
        json.loads(line)
        for line in server.log.read_text().splitlines()
        if line.startswith("{") and '"worker_dispatcher_warmed"' in line
    ]
    assert events, "no worker_dispatcher_warmed event"
    # The first, before the first 200 (a second gateway process may warm later, under load).
    assert (events[0]["calls"], events[0]["level"]) == (DISPATCHER_TRAINING_CALLS, "info")
