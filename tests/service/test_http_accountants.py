"""Each accountant through HTTP on a real server: per-document ids, zCDP spend, the clock."""

from __future__ import annotations

import pytest

from service.tenants import Tenant, TenantsFile, hash_key
from tests.support import Server, client

pytestmark = [pytest.mark.server, pytest.mark.slow]

KEYS = {
    "seq": "sdp_test_seq_key_0123456789abcdef",
    "doc": "sdp_test_doc_key_0123456789abcdef",
    "rho": "sdp_test_rho_key_0123456789abcdef",
    "rhodoc": "sdp_test_rhodoc_key_0123456789abcdef",
}


@pytest.fixture(scope="module")
def accountants_server(quick_bundle_tag: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("accountants")
    tenants = [
        Tenant(id="seq", key_sha256=[hash_key(KEYS["seq"])], max_epsilon=10, budget=3),
        Tenant(
            id="doc",
            key_sha256=[hash_key(KEYS["doc"])],
            max_epsilon=10,
            budget=2,
            composition="per-document",
        ),
        Tenant(
            id="rho",
            key_sha256=[hash_key(KEYS["rho"])],
            max_epsilon=10,
            budget=10,
            accounting="zcdp",
            delta=1e-6,
        ),
        Tenant(
            id="rhodoc",
            key_sha256=[hash_key(KEYS["rhodoc"])],
            max_epsilon=10,
            budget=10,
            accounting="zcdp",
            delta=1e-6,
            composition="per-document",
            period_days=30,
        ),
    ]
    (folder / "tenants.json").write_text(TenantsFile(tenants=tenants).model_dump_json())
    env = {
        "SENTDP_MODEL": quick_bundle_tag,
        "SENTDP_TENANTS_FILE": str(folder / "tenants.json"),
        "SENTDP_LEDGER_URL": f"sqlite:///{folder / 'ledger.sqlite3'}",
    }
    server = Server(env, log=folder / "server.log").start()
    yield server
    server.stop()


def post(server: Server, tenant: str, user: str, documents: list[dict], epsilon: float = 1.0):  # type: ignore[no-untyped-def]
    with client(server, KEYS[tenant]) as http:
        return http.post(
            "/privatize", json={"user": user, "epsilon": epsilon, "documents": documents}
        )


def budget(server: Server, tenant: str, user: str) -> dict:
    with client(server, KEYS[tenant]) as http:
        return http.post("/budget", json={"user": user}).json()


def doc(document_id: str | None = None) -> dict:
    body: dict = {"text": "One sentence here. Another one there."}
    if document_id is not None:
        body["document_id"] = document_id
    return body


def test_document_ids_are_required_exactly_where_the_tenant_counts_per_document(
    accountants_server: Server,
) -> None:
    missing = post(accountants_server, "doc", "u0", [doc("a"), doc()])
    extra = post(accountants_server, "seq", "u0", [doc("a")])
    assert missing.status_code == extra.status_code == 400
    assert "accounts per document" in missing.json()["error"]["message"]
    assert "document 1" in missing.json()["error"]["message"]
    assert "accounts sequentially" in extra.json()["error"]["message"]


def test_per_document_spends_add_up_per_id_and_take_the_largest(accountants_server: Server) -> None:
    assert post(accountants_server, "doc", "u1", [doc("a"), doc("a")]).status_code == 200
    refused = post(accountants_server, "doc", "u1", [doc("a"), doc("b")])
    assert refused.status_code == 402  # "a" would reach 3 > 2, so nothing is charged
    assert post(accountants_server, "doc", "u1", [doc("b"), doc("c")]).status_code == 200
    assert post(accountants_server, "doc", "u1", [doc("c")]).status_code == 200
    view = budget(accountants_server, "doc", "u1")
    assert (view["composition"], view["accounting"]) == ("per-document", "pure")
    assert view["spend"] == view["largest_document_spend"] == 2.0
    assert view["spent_epsilon"] == 5.0  # every release, for the record
    assert view["documents"] == 5
    assert (
        post(
            accountants_server,
            "doc",
            "u1",
            [
                doc(
                    "c",
                )
            ],
        ).status_code
        == 402
    )
    assert post(accountants_server, "doc", "u1", [doc("d")]).status_code == 200  # a new one


def test_sequential_pure_is_unchanged(accountants_server: Server) -> None:
    for _ in range(3):
        assert post(accountants_server, "seq", "u2", [doc()]).status_code == 200
    assert post(accountants_server, "seq", "u2", [doc()]).status_code == 402
    view = budget(accountants_server, "seq", "u2")
    assert (view["spend"], view["spend_unit"], view["largest_document_spend"]) == (
        3.0,
        "epsilon",
        None,
    )


def test_zcdp_spends_rho(accountants_server: Server) -> None:
    response = post(accountants_server, "rho", "u3", [doc(), doc()], epsilon=2.0)
    assert response.status_code == 200
    view = response.json()["budget"]
    assert (view["accounting"], view["spend_unit"]) == ("zcdp", "rho")
    assert view["spend"] == 1.0  # 2 x 2^2 / 8
    assert view["limit"] == 10.0
    assert 1.0 < view["spend_limit"] < 2.0  # rho_max of (10, 1e-6): about 1.54
    assert view["remaining_epsilon"] > 0
    many = post(accountants_server, "rho", "u3", [doc()] * 16, epsilon=10.0)
    assert many.status_code == 402


def test_zcdp_per_document_with_a_clock(accountants_server: Server) -> None:
    ok = post(accountants_server, "rhodoc", "u4", [doc("x"), doc("y")], epsilon=3.0)
    assert ok.status_code == 200, ok.text
    view = budget(accountants_server, "rhodoc", "u4")
    assert view["largest_document_spend"] == pytest.approx(9 / 8)
    assert view["composition"] == "per-document"
