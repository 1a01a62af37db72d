"""Idempotency keys: validating a client's key, and the body HMAC that detects a reused key.

The HMAC secret lives in a file outside the ledger database (``SENTDP_IDEMPOTENCY_SECRET_FILE``,
mode 0600), so that a reader of the ledger or of its backups cannot test a guessed document
against the stored HMACs. The file holds one hex secret per line: the first signs new rows,
the others are still accepted (rotation: put a new secret on the first line, keep the old one
below it for 24 hours, then remove it). Several replicas must share the same file.
A database from schema version 1 kept its secret in ``sentdp_meta``; on first start it moves
into the file (as an accepted secret) and is deleted from the database.

The signed input includes the tenant and the key, so two rows carry the same HMAC only if they
are the same row: a reader of the ledger cannot tell that a user sent the same document twice,
or to two tenants (a hostile review found that the body alone made equal HMACs).

It also includes a digest of the caller's API key (:func:`caller_secret`), which sentdp never
stores. The default state folder holds the SQLite ledger and the secret file side by side, so
a backup of it holds both (a hostile review found that it could then test a guessed document
against the stored HMACs); without the API key it still cannot. A retry must therefore use
the API key of its first attempt: under another key of the same tenant it is refused as a
reused key, and its first attempt's charge stands.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from service.errors import ApiError, Code
from service.ledger import IdempotencyKey, SqlLedger
from service.schemas import DocumentIn

MAX_KEY_LENGTH = 200


@dataclass(frozen=True)
class BodySigner:
    """HMAC-SHA256 of a canonical request body under the current and accepted secrets."""

    current: bytes
    accepted: tuple[bytes, ...] = ()

    def key(
        self,
        key: str | None,
        tenant: str,
        endpoint: str,
        user: str,
        epsilon: float,
        documents: list[DocumentIn],
        caller: bytes,
    ) -> IdempotencyKey | None:
        """The ledger's key for a request, or None without a key; 400 for an invalid one.
        ``caller`` is :func:`caller_secret` of the request's API key."""
        if len(caller) != CALLER_BYTES:  # checked with or without a key: a wiring bug shows
            raise ValueError("caller must be caller_secret() of the request's API key")
        if key is None:
            return None
        if not 1 <= len(key) <= MAX_KEY_LENGTH or not key.isprintable():
            raise ApiError(
                Code.INVALID_IDEMPOTENCY_KEY,
                f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable characters",
            )
        body = _canonical(
            {
                "endpoint": endpoint,
                "user": user,
                "epsilon": epsilon,
                "documents": [d.model_dump() for d in documents],
            }
        )
        # A canonical object holds no raw newline, so the split is unambiguous.
        signed = (
            body
            + b"\n"
            + _canonical({"tenant": tenant, "key": key, "caller": caller.hex(), "format": 3})
        )
        digests = [_digest(s, signed) for s in self.accepted]
        # Rows a sentdp from before this form stored (without the caller) still replay until
        # they expire, 24 hours after they were stored; this can go in a later release.
        before = body + b"\n" + _canonical({"tenant": tenant, "key": key, "format": 2})
        digests += [_digest(s, before) for s in (self.current, *self.accepted)]
        return IdempotencyKey(key, _digest(self.current, signed), tuple(digests))


CALLER_BYTES = 32
CALLER_LABEL = b"sentdp body-hmac caller"


def caller_secret(api_key: str) -> bytes:
    """What the body HMAC signs of the caller's API key: HMAC-SHA256 of the key under a fixed
    label. Computing it needs the key itself: the tenants file keeps the key's SHA-256, and
    HMAC reads its message whole. (Keyed by the API key instead, a key over 64 bytes would
    be replaced by its SHA-256, which the tenants file holds: a review found that.)"""
    return hmac.new(CALLER_LABEL, api_key.encode("utf-8"), hashlib.sha256).digest()


def _canonical(fields: dict[str, object]) -> bytes:
    return json.dumps(fields, sort_keys=True).encode()


def _digest(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def read_secrets(path: Path) -> list[bytes]:
    """The secrets of a secret file, current first (blank lines and ``#`` comments skipped)."""
    found = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            secret = bytes.fromhex(text)
            if len(secret) < 16:
                raise ValueError(f"{path}: a secret must be at least 16 bytes (32 hex digits)")
            found.append(secret)
    if not found:
        raise ValueError(f"{path} holds no secret")
    return found


def write_new_secret_file(path: Path, previous: list[bytes]) -> None:
    """Create ``path`` (mode 0600) with a fresh current secret, unless it exists already.

    Written to a private temporary file and linked into place, so a concurrent reader never
    sees a partial file and two processes starting together end up with the same secrets.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = [secrets.token_hex(32), *(s.hex() for s in previous)]
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # mode 0600
    try:
        with os.fdopen(handle, "w") as out:
            out.write("\n".join(lines) + "\n")
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # another process won: use its file
            os.link(temporary, path)
    finally:
        os.unlink(temporary)


def load_signer(path: Path, ledger: SqlLedger) -> BodySigner:
    """The signer from the secret file, creating the file (and moving a version-1 secret out
    of the database) on first start."""
    legacy = ledger.legacy_hmac_secret()
    if not path.exists():
        write_new_secret_file(path, [legacy] if legacy is not None else [])
    found = read_secrets(path)
    if legacy is not None and legacy in found:
        ledger.forget_legacy_hmac_secret()
    return BodySigner(found[0], tuple(found[1:]))
