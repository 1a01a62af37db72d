"""Tenants: who may call, with which API keys (stored as SHA-256 hashes), under which budget.

The tenants file is JSON::

    {"tenants": [{"id": "acme", "key_sha256": ["<64 hex>"], "max_epsilon": 10,
                  "group_size": 1, "budget": 100}]}

API keys are random 256-bit tokens (``sentdp-admin new-key``), so one SHA-256 is a safe
verifier; comparisons are constant-time. User ids are scoped per tenant. A running server
re-reads the file when it changes (:class:`TenantSource`), so ``sentdp-admin revoke-key`` and
budget changes take effect within a second, without a restart. The file is written atomically
with mode 0600 (:func:`write_private`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sentdp.accounting import MAX_LEDGER_VALUE, MICRO, Policy, budget_micro
from sentdp.zcdp import rho_budget_micro

MAX_EPSILON_LIMIT = 1000.0
KEY_PREFIX = "sdp_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh API key (shown once; only its hash is stored)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


NEW_TENANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What ``sentdp-admin new-key`` accepts as a new tenant's id: ``..`` or ``-x`` would read as a
path or as a flag on its command line."""


class Tenant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    """Letters, digits, ``.``, ``_`` and ``-``; a new tenant's id also starts with a letter
    or digit (:data:`NEW_TENANT_ID`), while files written before that rule still load."""
    key_sha256: list[str] = Field(default_factory=list)
    """SHA-256 of each API key; a tenant whose keys are all revoked cannot call."""
    max_epsilon: float = Field(gt=0, le=MAX_EPSILON_LIMIT)
    """Largest epsilon one request may ask for, per document."""
    group_size: int = Field(default=1, ge=1, le=1000)
    """g: the number of sentence positions protected together."""
    budget: float = Field(ge=0, le=1e9)
    """B: each user's budget per period, in group-epsilon (g times the spend)."""
    composition: Literal["sequential", "per-document"] = "sequential"
    """``sequential``: every release adds up (protects up to g segments in every document at
    once). ``per-document``: releases of one document id add up, distinct ids are disjoint
    (protects up to g segments anywhere; a sentence repeated in r documents counts r times)."""
    accounting: Literal["pure", "zcdp"] = "pure"
    """``pure``: epsilon-DP. ``zcdp``: (B, delta)-DP through rho = epsilon^2/8 per release."""
    delta: float | None = Field(default=None, gt=0, lt=1e-2)
    """delta of the (B, delta) guarantee; required with ``zcdp``, not allowed without."""
    period_days: int | None = Field(default=None, ge=1, le=3660)
    """Renew every user's budget every this many days (windows aligned to the Unix epoch,
    UTC); unset: only ``sentdp-admin new-period`` renews."""

    @field_validator("key_sha256")
    @classmethod
    def _hex_digests(cls, value: list[str]) -> list[str]:
        for digest in value:
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("key_sha256 holds lowercase hex SHA-256 digests of API keys")
        return value

    @model_validator(mode="after")
    def _fits_the_ledger(self) -> Tenant:
        if (self.accounting == "zcdp") != (self.delta is not None):
            raise ValueError("delta is required with accounting 'zcdp', and only there")
        if self.group_size**2 * (budget_micro(self.budget) + MICRO * 2000) >= MAX_LEDGER_VALUE:
            raise ValueError("group_size * budget is too large for the ledger's integers")
        return self

    @property
    def policy(self) -> Policy:
        limit = (
            budget_micro(self.budget)
            if self.delta is None
            else rho_budget_micro(self.budget, self.delta)
        )
        return Policy(
            group_size=self.group_size,
            limit_micro=limit,
            accounting=self.accounting,
            composition=self.composition,
            period_seconds=None if self.period_days is None else self.period_days * 86_400,
            budget=self.budget,
        )


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: list[Tenant] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        ids = [t.id for t in self.tenants]
        if len(ids) != len(set(ids)):
            raise ValueError("tenant ids must be unique")
        hashes = [h for t in self.tenants for h in t.key_sha256]
        if len(hashes) != len(set(hashes)):
            raise ValueError("an API key may belong to one tenant only")
        return self


class TenantRegistry:
    """Look tenants up by API key or id."""

    def __init__(self, tenants: list[Tenant]) -> None:
        self._by_id = {t.id: t for t in tenants}
        self._hashes = [(h, t) for t in tenants for h in t.key_sha256]

    @classmethod
    def load(cls, path: Path) -> TenantRegistry:
        if not path.is_file():
            raise FileNotFoundError(
                f"no tenants file at {path}: create one with `sentdp-admin new-key --tenant ...`"
            )
        try:
            tenants = TenantsFile.model_validate(json.loads(path.read_text())).tenants
        except ValidationError as error:
            problem = ValueError(f"the tenants file {path} is not valid: {problems_of(error)}")
        except RecursionError:
            problem = ValueError(f"the tenants file {path} is JSON nested too deep")
        else:
            return cls(tenants)
        # raised out here: pydantic's error quotes the values (a key pasted where its hash
        # belongs), and the server logs this one with its traceback
        raise problem

    def authenticate(self, key: str | None) -> Tenant | None:
        if not key:
            return None
        digest = hash_key(key)
        found = None
        for stored, tenant in self._hashes:  # no early exit: time does not depend on position
            if hmac.compare_digest(stored, digest):
                found = tenant
        return found

    def get(self, tenant_id: str) -> Tenant | None:
        return self._by_id.get(tenant_id)

    def tenants(self) -> list[Tenant]:
        return list(self._by_id.values())


RELOAD_SECONDS = 1.0
"""How long a running server's process may keep serving its last look at the tenants file."""


class TenantSource:
    """The tenants file of a running server, re-read when it changes.

    The file's (mtime, size, inode) is checked at most once per ``interval`` seconds. A file
    that fails to load keeps the previous registry (and logs why): ``sentdp-admin`` writes it
    atomically, so a half-written file is never read.
    """

    def __init__(
        self,
        path: Path,
        interval: float = RELOAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._checked = clock()
        self._signature = self._stat()
        self._registry = TenantRegistry.load(path)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            info = self.path.stat()
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size, info.st_ino

    def registry(self) -> TenantRegistry:
        """The current tenants."""
        now = self._clock()
        if now - self._checked < self.interval:
            return self._registry
        with self._lock:
            self._checked = now
            signature = self._stat()
            if signature is not None and signature != self._signature:
                try:
                    self._registry = TenantRegistry.load(self.path)
                    self._signature = signature
                except (OSError, ValueError):
                    logging.getLogger("sentdp.service").exception(
                        "the tenants file changed but does not load; keeping the previous one"
                    )
        return self._registry


def problems_of(error: ValidationError) -> str:
    """Where and what, without the values (pydantic's own message quotes them)."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or '(the file)'}: {problem['msg']}"
        for problem in error.errors(include_url=False, include_input=False, include_context=False)
    )


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by its owner only (0600 from creation).
    A file that exists keeps its owner and group (an operator running ``sudo sentdp-admin``
    must not leave the server a tenants file it cannot read); where that cannot be done the
    write is refused and the file left as it was."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            with contextlib.suppress(FileNotFoundError):
                owner = os.stat(path)
                if (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
                    try:
                        os.fchown(out.fileno(), owner.st_uid, owner.st_gid)
                    except PermissionError:
                        raise PermissionError(
                            f"{path} belongs to uid {owner.st_uid}; write it as that user"
                        ) from None
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:  # the rename itself is durable
            os.fsync(directory)
        finally:
            os.close(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):  # replaced already
            os.unlink(temporary)
