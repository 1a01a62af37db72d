"""sentdp-admin: tenants and keys written privately and atomically; revocation reaches a
running server's view of the tenants file without a restart."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import pytest

from service.admin import main
from service.ledger import open_ledger
from service.tenants import TenantRegistry, TenantSource
from tests.support import age_pending_keys, ledger_files_hold


@pytest.fixture
def tenants_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state" / "tenants.json"
    monkeypatch.setenv("SENTDP_TENANTS_FILE", str(path))
    monkeypatch.setenv("SENTDP_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    return path


def new_key(tenant: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    main(["new-key", "--tenant", tenant, *extra])
    return capsys.readouterr().out.strip()


def test_keys_and_tenants_are_written_private(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = new_key("acme", capsys, "--key-file", str(tmp_path / "keys" / "acme"), "--budget", "7")
    assert tenants_file.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "keys" / "acme").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "keys" / "acme").read_text().strip() == key
    assert TenantRegistry.load(tenants_file).authenticate(key).budget == 7
    assert sorted(p.name for p in tenants_file.parent.iterdir()) == ["tenants.json"]


def test_revoking_one_key_or_all(tenants_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = new_key("acme", capsys)
    second = new_key("acme", capsys)
    other = new_key("other", capsys)
    main(["revoke-key", "--tenant", "acme", "--key", first])
    registry = TenantRegistry.load(tenants_file)
    assert registry.authenticate(first) is None
    assert registry.authenticate(second).id == "acme"
    with pytest.raises(SystemExit, match="not one of the keys of tenant 'acme'"):
        main(["revoke-key", "--tenant", "acme", "--key", other])
    main(["revoke-key", "--tenant", "acme", "--all"])
    registry = TenantRegistry.load(tenants_file)
    assert registry.authenticate(second) is None
    assert registry.get("acme") is not None  # the tenant and its users' budgets remain
    assert registry.authenticate(other).id == "other"
    with pytest.raises(SystemExit, match="no tenant 'ghost'"):
        main(["revoke-key", "--tenant", "ghost", "--all"])


def test_a_running_source_sees_a_revocation_after_its_interval(
    tenants_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = new_key("acme", capsys)
    now = [0.0]
    source = TenantSource(tenants_file, interval=1.0, clock=lambda: now[0])
    assert source.registry().authenticate(key) is not None
    main(["revoke-key", "--tenant", "acme", "--key", key])
    assert source.registry().authenticate(key) is not None  # checked at most once a second
    now[0] = 1.5
    assert source.registry().authenticate(key) is None
    tenants_file.write_text("{broken")  # a bad file keeps the last good registry
    now[0] = 3.0
    assert source.registry().get("acme") is not None


def test_a_tenants_file_the_server_cannot_load_is_logged_without_its_values(
    tenants_file: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """An operator who pastes a key where its hash belongs: pydantic's message quotes it, and
    the server logs the error with its traceback when it reloads the file (or starts)."""
    key = new_key("acme", capsys)
    now = [0.0]
    source = TenantSource(tenants_file, interval=1.0, clock=lambda: now[0])
    pasted = json.loads(tenants_file.read_text())
    pasted["tenants"][0]["key_sha256"] = [key]
    tenants_file.write_text(json.dumps(pasted))
    now[0] = 2.0
    with caplog.at_level("ERROR", logger="sentdp.service"):
        assert source.registry().get("acme") is not None  # the last good one
    (record,) = caplog.records
    logged = caplog.text + "".join(traceback.format_exception(*record.exc_info))
    assert "key_sha256 holds lowercase hex SHA-256 digests" in logged
    assert key not in logged
    assert "sdp_" not in logged
    with pytest.raises(ValueError, match="is not valid") as refused:
        TenantRegistry.load(tenants_file)  # as the server starts
    assert key not in "".join(traceback.format_exception(refused.value))
    tenants_file.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nested too deep"):
        TenantRegistry.load(tenants_file)
    with pytest.raises(SystemExit, match="not a tenants file"):
        main(["budget", "--tenant", "acme", "--user", "u"])


def test_purge_reports_what_it_deleted(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}").close()
    main(["purge"])
    assert json.loads(capsys.readouterr().out) == {"purged_idempotency_rows": 0}


def test_purge_leaves_no_byte_of_a_purged_reply_in_the_sqlite_files(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sentdp.accounting import MICRO, Charge, Policy
    from service.ledger import IDEMPOTENCY_TTL_SECONDS, IdempotencyKey, Reservation

    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    key = IdempotencyKey("k", "h")
    reserved = ledger.reserve(
        "acme", "u", Charge("deepcandidate", MICRO, 1), Policy(1, MICRO), "r", key
    )
    assert isinstance(reserved, Reservation)
    ledger.settle("acme", "u", reserved.charge_ids, [], key, '"REPLY-MARKER' + "x" * 2000 + '"')
    age_pending_keys(ledger, IDEMPOTENCY_TTL_SECONDS + 60)
    ledger.scrub()  # the reply is in the database file
    ledger.close()
    assert ledger_files_hold(tmp_path, b"REPLY-MARKER")
    main(["purge"])
    assert json.loads(capsys.readouterr().out) == {"purged_idempotency_rows": 1}
    assert not ledger_files_hold(tmp_path, b"REPLY-MARKER")


def test_prune_deletes_old_history_and_leaves_no_byte_of_it_in_the_sqlite_files(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sentdp.accounting import MICRO, PER_DOCUMENT, Charge, Policy
    from service.ledger import Reservation

    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    policy = Policy(1, 5 * MICRO, composition=PER_DOCUMENT)
    marker = "DOC-MARKER-" + "y" * 40
    reserved = ledger.reserve(
        "acme", "u", Charge("deepcandidate", MICRO, 1, (marker,)), policy, "REQ-MARKER"
    )
    assert isinstance(reserved, Reservation)
    ledger.settle("acme", "u", reserved.charge_ids, [])
    ledger.new_period("acme", "u")
    with ledger.transaction() as cur:
        ledger._execute(cur, "UPDATE sentdp_charges SET settled_at = settled_at - 864000")
    ledger.scrub()
    ledger.close()
    assert ledger_files_hold(tmp_path, marker.encode())
    main(["prune", "--settled-days", "30"])  # settled 10 days ago: kept
    assert json.loads(capsys.readouterr().out) == {
        "pruned_charge_rows": 0,
        "pruned_document_rows": 1,  # a past period's per-document spend
    }
    assert ledger_files_hold(tmp_path, marker.encode())  # the charge row still names it
    main(["prune", "--settled-days", "7"])
    assert json.loads(capsys.readouterr().out) == {
        "pruned_charge_rows": 1,
        "pruned_document_rows": 0,
    }
    assert not ledger_files_hold(tmp_path, marker.encode())
    assert not ledger_files_hold(tmp_path, b"REQ-MARKER")
    for days in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit, match="number of days"):
            main(["prune", "--settled-days", days])


def test_budget_names_what_is_missing_instead_of_reporting_nothing_spent(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run without the server's variables, sentdp-admin would read (and create) another
    ledger and report every user as unspent: it refuses a missing SQLite ledger and a tenant
    its tenants file does not know, and says where the server's are."""
    new_key("acme", capsys)
    who = ["--tenant", "acme", "--user", "u"]
    for command in (["budget", *who], ["new-period", *who], ["purge"]):
        with pytest.raises(SystemExit, match=r"no ledger at .*SENTDP_STATE_DIR=\.sentdp"):
            main(command)
    assert not (tmp_path / "ledger.sqlite3").exists()
    open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}").close()
    with pytest.raises(SystemExit, match=r"no tenant 'nobody' in .*tenants\.json"):
        main(["budget", "--tenant", "nobody", "--user", "u"])
    main(["budget", "--tenant", "acme", "--user", "u"])
    assert json.loads(capsys.readouterr().out)["spent_epsilon"] == 0.0


def test_a_tenant_can_be_created_with_its_accountant(
    tenants_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = new_key(
        "rho", capsys, "--accounting", "zcdp", "--delta", "1e-6", "--composition",
        "per-document", "--period-days", "30", "--budget", "10",
    )  # fmt: skip
    policy = TenantRegistry.load(tenants_file).authenticate(key).policy
    assert (policy.name, policy.period_seconds, policy.budget) == (
        "zcdp-per-document",
        30 * 86_400,
        10.0,
    )
    with pytest.raises(SystemExit, match="delta is required"):
        main(["new-key", "--tenant", "bad", "--accounting", "zcdp"])


@pytest.mark.postgres
def test_a_postgresql_schema_without_a_ledger_is_refused_and_not_created(
    ledger_url: tuple[str, str],
    tenants_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mistyped SENTDP_LEDGER_SCHEMA is refused; the schema is not created (it used to be,
    with empty tables, and every user read as unspent)."""
    import psycopg

    url, schema = ledger_url
    if not url.startswith("postgres"):
        pytest.skip("PostgreSQL only")
    new_key("acme", capsys)
    open_ledger(url, schema).close()
    monkeypatch.setenv("SENTDP_LEDGER_URL", url)
    monkeypatch.setenv("SENTDP_LEDGER_SCHEMA", f"{schema}_typo")
    with pytest.raises(SystemExit, match=rf"no ledger in schema {schema}_typo of database"):
        main(["budget", "--tenant", "acme", "--user", "u"])
    with psycopg.connect(url, autocommit=True) as conn:
        made = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (f"{schema}_typo",)
        ).fetchone()
    assert made is None
    monkeypatch.setenv("SENTDP_LEDGER_SCHEMA", schema)
    main(["budget", "--tenant", "acme", "--user", "u"])
    assert json.loads(capsys.readouterr().out)["spent_epsilon"] == 0.0
    main(["recount-replies"])
    assert json.loads(capsys.readouterr().out) == {"recounted": True}


def test_policy_options_for_an_existing_tenant_are_refused_not_ignored(
    tenants_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new user's trial: `new-key --tenant acme --budget 50` on an existing tenant said
    "saved" and left the budget at its old value."""
    first = new_key("acme", capsys, "--budget", "20")
    before = tenants_file.read_text()
    with pytest.raises(SystemExit, match=r"tenant 'acme' exists: .*--budget.*set-tenant"):
        main(["new-key", "--tenant", "acme", "--budget", "50"])
    assert tenants_file.read_text() == before
    second = new_key("acme", capsys)  # a key alone is still added
    registry = TenantRegistry.load(tenants_file)
    assert registry.authenticate(first).budget == registry.authenticate(second).budget == 20


def test_set_tenant_changes_limits_and_keeps_keys_and_accountant(
    tenants_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = new_key("acme", capsys, "--budget", "20", "--composition", "per-document")
    main(["set-tenant", "--tenant", "acme", "--budget", "50", "--max-epsilon", "4"])
    assert json.loads(capsys.readouterr().out) == {
        "tenant": "acme", "max_epsilon": 4.0, "group_size": 1, "budget": 50.0,
    }  # fmt: skip
    tenant = TenantRegistry.load(tenants_file).authenticate(key)
    assert (tenant.budget, tenant.max_epsilon, tenant.composition) == (50, 4, "per-document")
    for wrong, message in (
        (["--tenant", "ghost", "--budget", "1"], "no tenant 'ghost'"),
        (["--tenant", "acme"], "needs --max-epsilon"),
        (["--tenant", "acme", "--group-size", "0"], "invalid tenant"),
    ):
        with pytest.raises(SystemExit, match=message):
            main(["set-tenant", *wrong])
    assert TenantRegistry.load(tenants_file).authenticate(key).group_size == 1


def test_budget_prints_what_the_http_budget_says(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new_key("acme", capsys, "--budget", "20", "--group-size", "2")
    open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}").close()
    main(["budget", "--tenant", "acme", "--user", "u"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["tenant"] == "acme"
    assert (shown["spent_epsilon"], shown["limit"], shown["remaining"]) == (0.0, 20.0, 20.0)
    assert (shown["group_size"], shown["remaining_epsilon"]) == (2, 10.0)


def test_writers_of_the_tenants_file_take_turns(tenants_file: Path) -> None:
    """Read, change and write under one lock: keys added from many threads at once are all
    kept (without the lock a write that read the file earlier drops the others' keys)."""
    from concurrent.futures import ThreadPoolExecutor

    from service.admin import add_key

    with ThreadPoolExecutor(8) as pool:
        keys = list(pool.map(lambda _: add_key(tenants_file, "acme", 10.0, 1, 100.0), range(40)))
    registry = TenantRegistry.load(tenants_file)
    assert all(registry.authenticate(key) is not None for key in keys)
    assert sorted(p.name for p in tenants_file.parent.iterdir()) == ["tenants.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_rewrite_keeps_the_tenants_file_s_owner(
    tenants_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sudo sentdp-admin ...` must not leave the server's user a tenants file it cannot read."""
    new_key("acme", capsys)
    os.chown(tenants_file, 1234, 1234)
    main(["set-tenant", "--tenant", "acme", "--budget", "50"])
    stat = tenants_file.stat()
    assert (stat.st_uid, stat.st_gid, stat.st_mode & 0o777) == (1234, 1234, 0o600)


def test_set_tenant_warns_when_a_change_weakens_the_current_period(
    tenants_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new_key("acme", capsys, "--budget", "20", "--group-size", "2")
    main(["set-tenant", "--tenant", "acme", "--budget", "10", "--group-size", "3"])
    assert "warning" not in capsys.readouterr().err
    main(["set-tenant", "--tenant", "acme", "--budget", "30", "--group-size", "1"])
    err = capsys.readouterr().err
    assert "the budget is raised" in err
    assert "the group size is lowered" in err


def test_budget_refuses_a_user_id_the_server_refuses(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to read such an id as an unspent account (no request can ever name it)."""
    new_key("acme", capsys)
    open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}").close()
    for command in ("budget", "new-period"):
        with pytest.raises(SystemExit, match=r"the server refuses that user id: .*two in a row"):
            main([command, "--tenant", "acme", "--user", "bad  user"])


def test_a_bad_tenants_file_is_named_and_none_of_it_is_quoted(
    tenants_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key pasted where its hash belongs, broken JSON or bytes that are not UTF-8: a message
    naming the file and where it is wrong, never a traceback quoting the key."""
    secret = "sdp_PLAINTEXT_SECRET_KEY"
    tenants_file.parent.mkdir(parents=True)
    tenant = {"id": "acme", "key_sha256": [secret], "max_epsilon": 8, "budget": 10}
    for content, why in (
        (
            json.dumps({"tenants": [tenant]}).encode(),
            "is not valid: tenants.0.key_sha256: Value error",
        ),
        (b"{not json", "is not JSON: Expecting property name"),
        (b'{"tenants": [\xff]}', "is not UTF-8 \\(byte 13\\)"),
    ):
        tenants_file.write_bytes(content)
        for command in (
            ["budget", "--tenant", "acme", "--user", "u"],
            ["new-key", "--tenant", "b"],
        ):
            with pytest.raises(SystemExit, match=f"the tenants file .*tenants.json {why}") as ended:
                main(command)
            assert secret not in str(ended.value.code)
    tenants_file.unlink()
    tenants_file.mkdir()
    with pytest.raises(SystemExit, match=r"tenants\.json is a directory"):
        main(["new-key", "--tenant", "b"])


def test_a_ledger_url_s_password_is_never_printed(
    tenants_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    new_key("acme", capsys)
    monkeypatch.setenv("SENTDP_LEDGER_URL", "mysql://u:SuperSecretPw@127.0.0.1/test")
    with pytest.raises(SystemExit, match="unsupported ledger URL scheme 'mysql'") as ended:
        main(["purge"])
    assert "SuperSecretPw" not in str(ended.value.code)
    monkeypatch.setenv("SENTDP_LEDGER_URL", "sqlite://u:SuperSecretPw@127.0.0.1/test")
    with pytest.raises(SystemExit, match="a SQLite ledger URL is sqlite:/// and a") as ended:
        main(["purge"])
    assert "SuperSecretPw" not in str(ended.value.code)


def test_a_bad_setting_is_named_without_its_value(
    tenants_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SENTDP_METRICS_TOKEN", "TooShortSecret")
    with pytest.raises(SystemExit, match="SENTDP_METRICS_TOKEN: String should have") as ended:
        main(["purge"])
    assert "TooShortSecret" not in str(ended.value.code)


def test_postgresql_s_messages_which_can_quote_the_password_are_not_shown(
    tenants_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psycopg")
    new_key("acme", capsys)
    for url in (
        "postgresql://sentdp:p%zzSecret@127.0.0.1:1/ledger",  # libpq quotes the bad token
        "postgresql://sentdp:p@Secret@127.0.0.1:1/ledger",  # and the host it cannot resolve
    ):
        monkeypatch.setenv("SENTDP_LEDGER_URL", url)
        with pytest.raises(SystemExit, match=r"PostgreSQL \(its message is not") as ended:
            main(["purge"])
        assert "Secret" not in str(ended.value.code)


def test_a_ledger_file_that_is_not_a_database_is_a_message(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new_key("acme", capsys)
    (tmp_path / "ledger.sqlite3").write_text("not a database, " * 100)
    with pytest.raises(SystemExit, match="the ledger failed: DatabaseError: file is not a"):
        main(["budget", "--tenant", "acme", "--user", "u"])


def test_a_key_file_that_cannot_be_written_leaves_no_valid_key(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The key file is written before the key is added, so no key is ever valid that nobody
    holds; a key that is then refused takes its file with it."""
    kept = new_key("acme", capsys)
    before = tenants_file.read_bytes()
    (tmp_path / "a-file").write_text("x")
    for tenant in ("acme", "new-tenant"):
        with pytest.raises(SystemExit, match=r"cannot write the key file .*nothing was changed"):
            main(["new-key", "--tenant", tenant, "--key-file", str(tmp_path / "a-file" / "k")])
    assert capsys.readouterr().out == ""  # never printed
    assert tenants_file.read_bytes() == before
    assert TenantRegistry.load(tenants_file).authenticate(kept).id == "acme"
    key_file = tmp_path / "keys" / "refused"
    with pytest.raises(SystemExit, match="tenant 'acme' exists"):
        main(["new-key", "--tenant", "acme", "--budget", "3", "--key-file", str(key_file)])
    assert not key_file.exists()
    assert tenants_file.read_bytes() == before


def test_a_key_file_never_replaces_state_or_a_file_that_is_not_a_key(
    tenants_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written over the tenants file, the key took every tenant with it (its clean-up then
    removed the file); the ledger, the idempotency secret and any other file are kept too."""
    kept = new_key("acme", capsys)
    ledger = tmp_path / "ledger.sqlite3"
    open_ledger(f"sqlite:///{ledger}").close()
    secret = tmp_path / "secret"
    secret.write_text("ab" * 32 + "\n")
    other = tmp_path / "notes.txt"
    other.write_text("my notes\n")
    link = tmp_path / "link.json"
    link.symlink_to(tenants_file)
    before = tenants_file.read_bytes()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SENTDP_IDEMPOTENCY_SECRET_FILE", str(secret))
        for target, what in (
            (tenants_file, "is the tenants file"),
            (link, "is the tenants file"),
            (ledger, "is the ledger"),
            (tmp_path / "ledger.sqlite3-wal", "is the ledger's wal file"),  # absent until used
            (secret, "is the idempotency secret"),
            (other, "does not hold one API key"),
            (tmp_path, "is not a plain file"),
        ):
            with pytest.raises(SystemExit, match=what):
                main(["new-key", "--tenant", "beta", "--key-file", str(target)])
    planted = tmp_path / "planted.key"  # someone else's file, or a link to one, holding a key
    planted.write_text("sdp_x\n")
    pointer = tmp_path / "pointer.key"
    pointer.symlink_to(planted)
    refused = [(pointer, "is not a plain file")]
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(planted, 12345, 12345)
        refused.append((planted, "belongs to another user"))
    for target, what in refused:
        with pytest.raises(SystemExit, match=what):
            main(["new-key", "--tenant", "beta", "--key-file", str(target)])
    assert planted.read_text() == "sdp_x\n"
    assert tenants_file.read_bytes() == before
    assert secret.read_text() == "ab" * 32 + "\n"
    assert other.read_text() == "my notes\n"
    assert TenantRegistry.load(tenants_file).authenticate(kept).id == "acme"
    assert capsys.readouterr().out == ""
    again = tmp_path / "beta.key"
    main(["new-key", "--tenant", "beta", "--key-file", str(again)])
    main(["new-key", "--tenant", "beta", "--key-file", str(again)])  # a key file is replaced
    assert again.read_text().strip() == capsys.readouterr().out.split()[-1]


def test_tenants_file_paths_that_cannot_be_used_are_messages(
    tenants_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tracebacks before (a parent that is a file, a key that is not text), and a FIFO was
    taken for a missing file and replaced."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SENTDP_TENANTS_FILE", str(tmp_path / "a-file" / "tenants.json"))
    with pytest.raises(SystemExit, match=r"sentdp-admin: .*a-file"):
        main(["new-key", "--tenant", "acme"])
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    monkeypatch.setenv("SENTDP_TENANTS_FILE", str(fifo))
    with pytest.raises(SystemExit, match="is not a regular file"):
        main(["new-key", "--tenant", "acme"])
    assert fifo.is_fifo()
    monkeypatch.setenv("SENTDP_TENANTS_FILE", str(tenants_file))
    main(["new-key", "--tenant", "acme"])
    with pytest.raises(SystemExit, match="that key is not one of the keys"):
        main(["revoke-key", "--tenant", "acme", "--key", "sdp_\udcff"])  # argv's bad byte


def test_an_invalid_tenant_is_one_line_without_pydantic_s_links(
    tenants_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["new-key", "--tenant", "acme", "--group-size", "0"])
    message = str(ended.value.code)
    assert message.startswith("sentdp-admin: invalid tenant: group_size: Input should be")
    assert "\n" not in message
    assert "errors.pydantic.dev" not in message
    assert not tenants_file.exists()


@pytest.mark.parametrize("tenant_id", ["..", ".", "-x", "_a", ".hidden"])
def test_a_tenant_id_starts_with_a_letter_or_digit(
    tenants_file: Path, tenant_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``..`` reads as a path and ``-x`` as a flag on sentdp-admin's command line; a tenants
    file written before the rule still loads, and its tenant can still get keys."""
    with pytest.raises(SystemExit, match="invalid tenant: a new tenant's id is 1 to 64"):
        main(["new-key", f"--tenant={tenant_id}"])
    assert not tenants_file.exists()
    new_key("a.b_c-9", capsys)
    assert TenantRegistry.load(tenants_file).get("a.b_c-9") is not None
    data = json.loads(tenants_file.read_text())
    data["tenants"].append(dict(data["tenants"][0], id=tenant_id, key_sha256=[]))
    tenants_file.write_text(json.dumps(data))
    main(["new-key", f"--tenant={tenant_id}"])
    key = capsys.readouterr().out.strip()
    assert TenantRegistry.load(tenants_file).authenticate(key).id == tenant_id
