"""The body-HMAC secret lives in its own private file, survives rotation, and leaves the DB."""

from __future__ import annotations

import hashlib
import hmac
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from service.errors import ApiError
from service.idempotency import (
    CALLER_LABEL,
    BodySigner,
    caller_secret,
    load_signer,
    read_secrets,
    write_new_secret_file,
)
from service.ledger import open_ledger
from service.schemas import DocumentIn
from service.tenants import hash_key

DOCS = [DocumentIn(text="One sentence. Another.")]
API_KEY = "sdp_acme_first_key_0123456789"
CALLER = caller_secret(API_KEY)


def test_the_secret_file_is_created_private_and_once(tmp_path: Path) -> None:
    path = tmp_path / "state" / "secret"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: write_new_secret_file(path, []), range(16)))
    assert path.stat().st_mode & 0o777 == 0o600
    (secret,) = read_secrets(path)
    assert len(secret) == 32
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret"]  # no temporary left


def test_a_version_1_secret_moves_out_of_the_database(tmp_path: Path) -> None:
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    with ledger.transaction() as cur:
        ledger._execute(cur, "INSERT INTO sentdp_meta VALUES ('hmac_secret', :v)", {"v": "cd" * 32})
    signer = load_signer(tmp_path / "secret", ledger)
    assert signer.accepted == (bytes.fromhex("cd" * 32),)
    assert signer.current != signer.accepted[0]
    assert ledger.legacy_hmac_secret() is None
    # Nor is it left in the ledger's files while the server runs, write-ahead log included,
    # for a file-level backup to copy (closing the last connection would hide that).
    files = sorted(tmp_path.glob("ledger.sqlite3*"))
    assert [f.name for f in files] == [
        "ledger.sqlite3",
        "ledger.sqlite3-shm",
        "ledger.sqlite3-wal",
        "ledger.sqlite3.writers",  # the writers' lock file, empty
    ]
    assert all(b"cd" * 32 not in f.read_bytes() for f in files)
    assert load_signer(tmp_path / "secret", ledger) == signer  # stable across restarts
    ledger.close()


def test_rotation_keeps_recent_keys_matching(tmp_path: Path) -> None:
    old = BodySigner(b"o" * 32)
    rotated = BodySigner(b"n" * 32, accepted=(b"o" * 32,))
    stored = old.key("k", "acme", "privatize", "u", 1.0, DOCS, CALLER)
    retried = rotated.key("k", "acme", "privatize", "u", 1.0, DOCS, CALLER)
    assert stored is not None
    assert retried is not None
    assert retried.body_hmac != stored.body_hmac
    assert retried.matches(stored.body_hmac)
    other = rotated.key("k", "acme", "privatize", "u", 2.0, DOCS, CALLER)
    assert other is not None
    assert not other.matches(stored.body_hmac)
    assert BodySigner(b"x" * 32).key(None, "acme", "privatize", "u", 1.0, DOCS, CALLER) is None
    with pytest.raises(ApiError, match="printable"):
        old.key("tab\tkey", "acme", "privatize", "u", 1.0, DOCS, CALLER)


def test_equal_bodies_under_other_keys_or_tenants_store_other_hmacs() -> None:
    """A ledger reader must not learn that a user sent one document twice, or to two tenants:
    the stored HMAC signs the tenant and the key with the body."""
    signer = BodySigner(b"s" * 32)
    stored = {
        signer.key(key, tenant, "privatize", "u", 1.0, DOCS, CALLER).body_hmac  # type: ignore[union-attr]
        for key, tenant in [("k1", "acme"), ("k2", "acme"), ("k1", "other")]
    }
    assert len(stored) == 3
    retried = signer.key("k1", "acme", "privatize", "u", 1.0, DOCS, CALLER)
    assert retried is not None
    assert retried.body_hmac in stored  # the same request signs the same


def _canonical(fields: dict[str, object]) -> bytes:
    return json.dumps(fields, sort_keys=True).encode()


BODY = _canonical(
    {
        "endpoint": "privatize",
        "user": "u",
        "epsilon": 1.0,
        "documents": [d.model_dump() for d in DOCS],
    }
)


def _hmac(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def test_rows_stored_before_the_caller_was_signed_still_match() -> None:
    """Rows of the previous form (tenant and key, no caller) replay until they expire; the
    form before that (the body alone) expired long ago and no longer matches."""
    signer = BodySigner(b"n" * 32, accepted=(b"o" * 32,))
    tenant_and_key = BODY + b"\n" + _canonical({"tenant": "acme", "key": "k", "format": 2})
    for secret in (b"n" * 32, b"o" * 32):
        retried = signer.key("k", "acme", "privatize", "u", 1.0, DOCS, CALLER)
        assert retried is not None
        previous = _hmac(secret, tenant_and_key)
        assert retried.body_hmac != previous
        assert retried.matches(previous)
        assert not retried.matches(_hmac(secret, BODY))
        changed = signer.key("k", "acme", "privatize", "u", 2.0, DOCS, CALLER)
        assert changed is not None
        assert not changed.matches(previous)


@pytest.mark.parametrize("api_key", [API_KEY, "sdp_" + "long-operator-chosen-key-" * 4])
def test_the_stored_hmac_needs_the_api_key_which_nothing_stored_holds(api_key: str) -> None:
    """A backup of the state folder holds the ledger, the secret file and the tenants file
    (the key's SHA-256): from those alone the stored HMAC of a guessed document cannot be
    recomputed, since it signs a digest of the API key itself, for keys of any length (HMAC
    keyed by a key over 64 bytes would use its SHA-256: the tenants file's value)."""
    secret = b"s" * 32
    caller = caller_secret(api_key)
    stored = BodySigner(secret).key("k", "acme", "privatize", "u", 1.0, DOCS, caller)
    assert stored is not None
    signed = {"tenant": "acme", "key": "k", "format": 3}
    assert stored.body_hmac == _hmac(
        secret, BODY + b"\n" + _canonical({**signed, "caller": caller.hex()})
    )
    kept = bytes.fromhex(hash_key(api_key))  # what the tenants file keeps
    derived = [
        kept,
        hashlib.sha256(kept).digest(),
        hmac.new(kept, CALLER_LABEL, hashlib.sha256).digest(),  # keyed by the key's digest
        hmac.new(CALLER_LABEL, kept, hashlib.sha256).digest(),
    ]
    for guess in derived:
        assert guess != caller
        message = BODY + b"\n" + _canonical({**signed, "caller": guess.hex()})
        assert _hmac(secret, message) != stored.body_hmac
    # the same request under the tenant's other key signs otherwise: not a retry of it
    other = BodySigner(secret).key(
        "k", "acme", "privatize", "u", 1.0, DOCS, caller_secret("sdp_acme_second_key_987")
    )
    assert other is not None
    assert not other.matches(stored.body_hmac)
    for key in ("k", None):  # a caller that is not a digest is refused, with a key or not
        with pytest.raises(ValueError, match="caller"):
            BodySigner(secret).key(key, "acme", "privatize", "u", 1.0, DOCS, kept[:16])


def test_a_secret_file_with_nothing_usable_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("# only a comment\n")
    with pytest.raises(ValueError, match="no secret"):
        read_secrets(path)
    path.write_text("abcd\n")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        read_secrets(path)


def test_the_moved_secret_leaves_the_wal_even_while_another_connection_reads(
    tmp_path: Path,
) -> None:
    """A checkpoint cannot truncate the WAL under a reader; the scrub waits for it."""
    path = tmp_path / "ledger.sqlite3"
    ledger = open_ledger(f"sqlite:///{path}")
    with ledger.transaction() as cur:
        ledger._execute(cur, "INSERT INTO sentdp_meta VALUES ('hmac_secret', :v)", {"v": "ab" * 32})
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM sentdp_meta").fetchone()  # holds a read snapshot
    ended = threading.Timer(0.5, lambda: reader.execute("COMMIT"))
    ended.start()
    ledger.forget_legacy_hmac_secret()  # its checkpoint is busy until the reader ends
    ended.join()
    files = sorted(tmp_path.glob("ledger.sqlite3*"))
    assert [f.name for f in files] == [
        "ledger.sqlite3",
        "ledger.sqlite3-shm",
        "ledger.sqlite3-wal",
        "ledger.sqlite3.writers",  # the writers' lock file, empty
    ]
    assert all(b"ab" * 32 not in f.read_bytes() for f in files)
    reader.close()
    ledger.close()
