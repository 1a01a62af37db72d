"""Refunds over real HTTP: failures before sampling are refunded (alone), failures after it
never are; keys are revoked on a running server; lookups and user ids are bounded."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

import pytest

from service.tenants import RELOAD_SECONDS
from tests.support import TENANTS, TEXT, client, error_of, ledger_of, privatize, read_journal

pytestmark = pytest.mark.server

ACME = TENANTS[0]


def test_failure_before_the_mechanism_is_refunded(server) -> None:
    journal = Path(server.env["SENTDP_SAMPLE_JOURNAL"])
    payload = {
        "user": "f-user",
        "epsilon": 1.0,
        "documents": [{"sentences": ["FAULT:before", "x"]}],
    }
    with client(server, ACME.key) as http:
        response = http.post("/privatize", json=payload, headers={"Idempotency-Key": "f1"})
        retry = http.post("/privatize", json=payload, headers={"Idempotency-Key": "f1"})
    assert response.status_code == 503, response.text
    assert error_of(response)["code"] == "worker_unavailable"
    assert retry.status_code == 503  # the key was released, so the retry ran (and failed) again
    ledger = ledger_of(server)
    assert ledger.account("acme", "f-user").spent_micro == 0
    charges = [c for c in ledger.charges("acme") if c["user"] == "f-user"]
    assert [c["state"] for c in charges] == ["refunded", "refunded"]
    assert not {c["id"] for c in charges} & read_journal(journal)


def test_failure_after_the_mechanism_is_never_refunded(server) -> None:
    journal = Path(server.env["SENTDP_SAMPLE_JOURNAL"])
    payload = {"user": "a-user", "epsilon": 1.0, "documents": [{"sentences": ["FAULT:after", "x"]}]}
    with client(server, ACME.key) as http:
        response = http.post("/privatize", json=payload)
    assert response.status_code == 500, response.text
    assert error_of(response)["code"] == "mechanism_failed"
    ledger = ledger_of(server)
    assert ledger.account("acme", "a-user").spent_micro == 1_000_000
    (charge,) = [c for c in ledger.charges("acme") if c["user"] == "a-user"]
    assert charge["state"] in {"reserved", "final"}
    assert charge["id"] in read_journal(journal)


def test_one_failing_document_is_refunded_alone_and_the_replay_keeps_503(server) -> None:
    journal = Path(server.env["SENTDP_SAMPLE_JOURNAL"])
    payload = {
        "user": "pf-user",
        "epsilon": 1.0,
        "documents": [{"sentences": ["FAULT:before", "x"]}, {"text": TEXT}],
    }
    with client(server, ACME.key) as http:
        response = http.post("/privatize", json=payload, headers={"Idempotency-Key": "pf1"})
        replay = http.post("/privatize", json=payload, headers={"Idempotency-Key": "pf1"})
    assert response.status_code == 503, response.text
    (released,) = error_of(response)["released"]
    assert released["k"] == 4
    assert (replay.status_code, replay.text) == (503, response.text)
    assert replay.headers["Idempotent-Replayed"] == "true"
    charges = [c for c in ledger_of(server).charges("acme") if c["user"] == "pf-user"]
    assert [c["state"] for c in charges] == ["refunded", "final"]
    assert charges[0]["id"] not in read_journal(journal)
    assert charges[1]["id"] in read_journal(journal)


def _settles_on(server, key: str, expected: int) -> bool:  # type: ignore[no-untyped-def]
    """Whether /budget under ``key`` answers ``expected`` in every gateway process within
    10 s of a change to the tenants file. Each process reads the file again at its first
    request a second or more after its last look, so waiting that second first means every
    process has seen the change: four requests in a row cannot tell that by themselves, since
    all four may reach the process that looked last (a CI run on 2 cores saw the other one
    still refuse the new key just after)."""

    def status() -> int:
        with client(server, key) as http:
            return http.post("/budget", json={"user": "rk-user"}).status_code

    time.sleep(RELOAD_SECONDS + 0.2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(status() == expected for _ in range(4)):  # both gateway processes
            return True
        time.sleep(0.2)
    return False


def test_a_key_revoked_on_a_running_server_stops_working(server) -> None:
    from service.admin import add_key, revoke_keys

    tenants_file = Path(server.env["SENTDP_TENANTS_FILE"])
    key = add_key(tenants_file, "acme", 10.0, 1, 100.0)
    assert _settles_on(server, key, 200)  # a new key works without a restart
    assert revoke_keys(tenants_file, "acme", key) == 1
    assert _settles_on(server, key, 401)  # and a revoked one stops working without a restart
    assert privatize(server, "rk-user").status_code == 200  # the tenant's other key still works


def test_the_stored_body_hmac_needs_the_callers_api_key(server) -> None:
    """A retry under the tenant's other API key is refused as a reused key, charged once; the
    stored HMAC is the body signed with a digest of the key itself, so a reader of the ledger,
    the secret file and the tenants file (a backup of the state folder) cannot test a guessed
    document against it."""
    from service.admin import add_key, revoke_keys
    from service.idempotency import CALLER_LABEL, BodySigner, caller_secret, read_secrets
    from service.schemas import DocumentIn
    from service.tenants import hash_key

    tenants_file = Path(server.env["SENTDP_TENANTS_FILE"])
    second = add_key(tenants_file, "acme", 10.0, 1, 100.0)
    try:
        assert _settles_on(server, second, 200)
        payload = {"user": "hk-user", "epsilon": 1.0, "documents": [{"text": TEXT}]}
        headers = {"Idempotency-Key": "hk-1"}
        with client(server, ACME.key) as http:
            first = http.post("/privatize", json=payload, headers=headers)
        with client(server, second) as http:
            other = http.post("/privatize", json=payload, headers=headers)
        with client(server, ACME.key) as http:
            again = http.post("/privatize", json=payload, headers=headers)
    finally:
        assert revoke_keys(tenants_file, "acme", second) == 1
    assert first.status_code == 200, first.text
    assert other.status_code == 422, other.text
    assert error_of(other)["code"] == "idempotency_key_reused"
    assert (again.status_code, again.headers.get("idempotent-replayed")) == (200, "true")
    ledger = ledger_of(server)
    assert ledger.account("acme", "hk-user").spent_micro == 1_000_000
    with ledger.transaction() as cur:
        (stored,) = ledger._execute(
            cur,
            "SELECT body_hmac FROM sentdp_idempotency WHERE tenant = 'acme' AND "
            "user_id = 'hk-user' AND key = 'hk-1'",
        ).fetchone()
    ledger.close()
    secret_file = server.env.get(
        "SENTDP_IDEMPOTENCY_SECRET_FILE", f"{server.home}/idempotency-secret"
    )
    signer = BodySigner(read_secrets(Path(secret_file))[0])
    documents = [DocumentIn(text=TEXT)]

    def signed(caller: bytes) -> str:
        key = signer.key("hk-1", "acme", "privatize", "hk-user", 1.0, documents, caller)
        assert key is not None
        return key.body_hmac

    assert signed(caller_secret(ACME.key)) == stored  # the guess is right, with the API key
    kept = bytes.fromhex(hash_key(ACME.key))  # what the tenants file keeps
    assert signed(hmac.new(kept, CALLER_LABEL, hashlib.sha256).digest()) != stored
    assert signed(kept) != stored


def test_free_lookups_are_bounded_and_users_validated_everywhere(server) -> None:
    model = server.env["SENTDP_MODEL"]
    with client(server, ACME.key) as http:
        many = http.post("/classify", json={"model": model, "candidates": [0] * 1001})
        enough = http.post("/classify", json={"model": model, "candidates": [0] * 1000})
        nul = http.post(
            "/classify", json={"user": "a\u0000b", "epsilon": 1.0, "documents": [{"text": TEXT}]}
        )
    assert many.status_code == 400, many.text
    assert enough.status_code == 200
    assert len(enough.json()["labels"]) == 1000
    assert nul.status_code == 400, nul.text
