"""Budget views, labels and free lookups: what a caller reads back, without a server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentdp.accounting import MICRO, Charge, Policy
from sentdp.errors import InputError
from service.errors import STATUS, ApiError, Code
from service.ledger import Account, BudgetExhaustedError
from service.lookup import Lookups
from service.tenants import TenantRegistry, TenantsFile, hash_key
from service.views import budget_view, exhausted_error, label_of
from tests.service.fakes import LABELS, tiny_bundle
from tests.support import wait_for

BUNDLE = tiny_bundle()


def test_the_budget_view_in_group_epsilon() -> None:
    view = budget_view(Account("t", "u", 3 * MICRO, 2, 1, 3 * MICRO), Policy(2, 10 * MICRO))
    assert view.model_dump() == {
        "user": "u",
        "spent_epsilon": 3.0,
        "group_size": 2,
        "group_epsilon": 6.0,
        "limit": 10.0,
        "remaining": 4.0,
        "remaining_epsilon": 2.0,
        "documents": 2,
        "period": 1,
        "accounting": "pure",
        "composition": "sequential",
        "spend": 6.0,
        "spend_limit": 10.0,
        "spend_unit": "epsilon",
        "largest_document_spend": None,
        "kept_by": None,
    }


def test_a_period_kept_by_the_tenants_old_accountant_shows_nothing_left() -> None:
    """Requests get 409 until a new period opens, so /budget must not offer a remainder
    computed from another accountant's units."""
    kept = Account("t", "u", 3 * MICRO, 2, 1, 3 * MICRO, "pure-sequential")
    zcdp = Policy(1, 10 * MICRO, "zcdp")
    view = budget_view(kept, zcdp)
    assert (view.remaining, view.remaining_epsilon, view.kept_by) == (0.0, 0.0, "pure-sequential")
    assert budget_view(kept, Policy(1, 10 * MICRO)).kept_by is None  # its own accountant
    assert budget_view(kept, Policy(1, 10 * MICRO)).remaining == 7.0


def test_after_a_lowered_budget_nothing_more_may_be_requested() -> None:
    """A budget lowered below what was spent: ``remaining`` shows the overdraft, and the
    largest epsilon one more release may have is 0, never negative."""
    view = budget_view(Account("t", "u", 8 * MICRO, 8, 0, 8 * MICRO), Policy(2, 10 * MICRO))
    assert (view.remaining, view.remaining_epsilon) == (-6.0, 0.0)


def test_the_402_names_the_request_and_the_remainder() -> None:
    refused = BudgetExhaustedError(
        Account("t", "u", 4 * MICRO, 4, 0, 4 * MICRO),
        Charge("deepcandidate", MICRO, 2),
        Policy(2, 10 * MICRO),
    )
    error = exhausted_error(refused)
    assert error.status == 402
    body = json.loads(error.json())["error"]
    assert (body["requested"], body["remaining"], body["group_size"]) == (2.0, 2.0, 2)
    assert body["remaining_epsilon"] == 1.0  # what may still be requested, against 2.0
    assert "only 1 remains" in body["message"]


def test_every_code_has_one_status_and_one_envelope() -> None:
    assert set(STATUS) == set(Code)
    error = ApiError(Code.TOO_MANY_DOCUMENTS, "too many", limit=4)
    assert error.status == 413
    assert error.body() == {
        "error": {"code": "too_many_documents", "message": "too many", "limit": 4}
    }


def test_labels_are_the_argmax_of_the_candidate_class_table() -> None:
    variant = BUNDLE.variants[1]
    label = label_of(BUNDLE, variant.record.offset + 3)
    assert label.label == LABELS[int(variant.candidate_class_probs[3].argmax())]
    assert sum(label.probabilities.values()) == pytest.approx(1.0)
    with pytest.raises(InputError, match="not in this bundle"):
        label_of(BUNDLE, BUNDLE.manifest.candidates)


def test_lookups_answer_only_for_versions_of_the_served_model(tmp_path: Path) -> None:
    other_version = tmp_path / "v2"
    (tmp_path / "encoder").mkdir()
    tiny_bundle(encoder_dir=tmp_path / "encoder").save(other_version)
    store = {
        "sentdp-unit:v2": ("sentdp-unit", "v2", other_version),
        "sentdp-unit:latest": ("sentdp-unit", "v2", other_version),
        "other-model:v1": ("other-model", "v1", other_version),
    }

    asked: list[str] = []

    def load(tag: str) -> tuple[str, str | None, Path]:
        asked.append(tag)
        return store[tag]

    lookups = Lookups(BUNDLE, "sentdp-unit:v1", load)
    assert lookups.labels("sentdp-unit:v1", [0, 41]).labels[1].candidate == 41
    assert lookups.labels("sentdp-unit:latest", [1]).model == "sentdp-unit:v2"  # the version
    assert lookups.bundle("sentdp-unit:v2") is lookups.bundle("sentdp-unit:latest")
    for unknown in ("other-model:v1", "missing:v9", "Sentdp-unit:v2", "sentdp-unit:V2", "::"):
        with pytest.raises(ApiError) as refused:
            lookups.labels(unknown, [0])
        assert refused.value.code == Code.UNKNOWN_MODEL
    assert set(asked) == {"sentdp-unit:latest"}  # the store never saw the others
    with pytest.raises(ApiError) as refused:
        lookups.labels("sentdp-unit:v1", [0, 10_000])
    assert refused.value.code == Code.INVALID_CANDIDATE


def test_tenants_file_keys_and_scoping(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    content = {
        "tenants": [
            {"id": "a", "key_sha256": [hash_key("ka")], "max_epsilon": 5, "budget": 10},
            {
                "id": "b",
                "key_sha256": [hash_key("kb")],
                "max_epsilon": 5,
                "group_size": 3,
                "budget": 9,
            },
        ]
    }
    path.write_text(json.dumps(content))
    registry = TenantRegistry.load(path)
    assert registry.authenticate("ka").id == "a"
    policy = registry.authenticate("kb").policy
    assert (policy.group_size, policy.limit_micro, policy.name) == (3, 9 * MICRO, "pure-sequential")
    assert registry.authenticate("kc") is None
    assert registry.authenticate(None) is None
    shared = {
        "tenants": [
            content["tenants"][0],
            {**content["tenants"][1], "key_sha256": [hash_key("ka")]},
        ]
    }
    with pytest.raises(ValueError, match="one tenant only"):
        TenantsFile.model_validate(shared)
    with pytest.raises(FileNotFoundError, match="sentdp-admin new-key"):
        TenantRegistry.load(tmp_path / "missing.json")


def test_a_lookup_never_waits_for_another_versions_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one caller's version is being loaded (slowly), a lookup in the served version
    answers at once, and callers of the version being loaded share one load."""
    import threading

    import service.lookup as lookup

    other_version = tmp_path / "v2"
    (tmp_path / "encoder").mkdir()
    tiny_bundle(encoder_dir=tmp_path / "encoder").save(other_version)
    release = threading.Event()
    loads: list[Path] = []
    real_load = lookup.Bundle.load

    def slow_load(path: Path) -> object:
        loads.append(path)
        release.wait(30)
        return real_load(path)

    monkeypatch.setattr(lookup.Bundle, "load", staticmethod(slow_load))
    asked: list[str] = []

    def store(tag: str) -> tuple[str, str | None, Path]:
        asked.append(tag)
        return ("sentdp-unit", "v2", other_version)

    lookups = Lookups(BUNDLE, "sentdp-unit:v1", store)
    answers: dict[str, object] = {}

    def ask(name: str, model: str) -> None:
        answers[name] = lookups.labels(model, [0]).labels[0].label

    loading = [threading.Thread(target=ask, args=(f"v2 {n}", "sentdp-unit:v2")) for n in range(2)]
    served = threading.Thread(target=ask, args=("v1", "sentdp-unit:v1"))
    try:
        for thread in loading:
            thread.start()
        wait_for(lambda: bool(loads))
        wait_for(lambda: len(asked) == 2)  # both v2 callers past the store: one loads, one waits
        assert len(loads) == 1
        served.start()
        served.join(5)
        assert not served.is_alive()  # it did not wait for v2's load
        assert set(answers) == {"v1"}
    finally:
        release.set()
        for thread in loading:
            thread.join(30)
    assert answers.keys() == {"v1", "v2 0", "v2 1"}
    assert loads == [other_version]  # one load for both callers
