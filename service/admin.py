"""``sentdp-admin``: operator commands for tenants, keys and budgets.

* ``new-key --tenant ID [--max-epsilon E --group-size G --budget B --composition C
  --accounting A --delta D --period-days N]``: add a tenant (or a key to an existing one) to
  the tenants file and print the new API key once; the policy options describe a new tenant
  and are refused for one that exists.
* ``set-tenant --tenant ID [--max-epsilon E] [--group-size G] [--budget B]``: change an
  existing tenant's limits (its accountant is changed by editing the tenants file).
* ``revoke-key --tenant ID (--key KEY | --key-file FILE | --all)``: remove API keys of a
  tenant; running servers stop accepting them within a second (they re-read the file).
* ``purge``: delete idempotency rows older than their 24-hour window now (servers also do it
  as they go).
* ``prune --settled-days N``: delete charge rows settled more than N days ago and per-document
  spends of past periods, history that no budget check reads (sentdp itself keeps them).
* ``budget --tenant ID --user U``: a user's spending in the current period and what is left,
  the fields of the HTTP ``/budget`` (as the tenant's next request will find it: a period
  that has ended shows as the next, empty one).
* ``new-period --tenant ID --user U``: start a new period for a user (Σε back to 0). The
  privacy guarantee then holds per period; use it only when your policy says so.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from sentdp.errors import SettingsError
from service.ledger import LedgerMissingError, open_ledger
from service.ledger.sql import SCRUB_WAIT_SECONDS
from service.schemas import UserId
from service.settings import ServiceSettings, load_settings
from service.tenants import (
    NEW_TENANT_ID,
    Tenant,
    TenantsFile,
    hash_key,
    new_key,
    problems_of,
    write_private,
)
from service.views import budget_view


def _read(path: Path) -> TenantsFile:
    """The tenants file (empty when there is none); a file that cannot be read or is not a
    valid tenants file ends the command with a message that names it and quotes none of its
    content (a key pasted where its hash belongs must not be echoed)."""
    if path.is_dir():
        raise SystemExit(f"sentdp-admin: the tenants file {path} is a directory")
    if os.path.lexists(path) and not path.is_file():  # a FIFO, a device, a dangling link
        raise SystemExit(f"sentdp-admin: the tenants file {path} is not a regular file")
    if not path.is_file():
        return TenantsFile()
    try:
        return TenantsFile.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except OSError as error:
        raise SystemExit(
            f"sentdp-admin: cannot read the tenants file {path}: {error.strerror}"
        ) from None
    except UnicodeDecodeError as error:
        raise SystemExit(
            f"sentdp-admin: the tenants file {path} is not UTF-8 (byte {error.start})"
        ) from None
    except json.JSONDecodeError as error:
        raise SystemExit(
            f"sentdp-admin: the tenants file {path} is not JSON: {error.msg} at line "
            f"{error.lineno}, column {error.colno}"
        ) from None
    except ValidationError as error:
        raise SystemExit(
            f"sentdp-admin: the tenants file {path} is not valid: {problems_of(error)}"
        ) from None
    except (RecursionError, ValueError):  # nested too deep; a number over Python's digit limit
        raise SystemExit(
            f"sentdp-admin: the tenants file {path} is not a tenants file (JSON nested too "
            "deep or a number too long)"
        ) from None


def _write(path: Path, tenants: TenantsFile) -> None:
    try:
        write_private(path, tenants.model_dump_json(indent=2))
    except PermissionError as refused:
        raise SystemExit(f"sentdp-admin: {refused}") from None


@contextlib.contextmanager
def _editing(path: Path) -> Iterator[None]:
    """One sentdp-admin at a time reads, changes and writes the tenants file (a revocation
    must not be undone by a write that read the file before it): an exclusive lock on its
    folder, which holds no other file for it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)


def add_key(
    path: Path,
    tenant_id: str,
    max_epsilon: float,
    group_size: int,
    budget: float,
    accountant: dict[str, Any] | None = None,
    policy_given: Sequence[str] = (),
    key: str | None = None,
) -> str:
    """Add a key (``key``, else a new one; and the tenant, if new, with its ``accountant``
    fields: composition, accounting, delta, period_days) to the tenants file; return the key.
    ``policy_given`` names the options the caller set: refused for a tenant that exists,
    never ignored."""
    with _editing(path):
        return _add_key(
            path, tenant_id, max_epsilon, group_size, budget, accountant, policy_given, key
        )


def _add_key(
    path: Path,
    tenant_id: str,
    max_epsilon: float,
    group_size: int,
    budget: float,
    accountant: dict[str, Any] | None,
    policy_given: Sequence[str],
    key: str | None = None,
) -> str:
    key = key or new_key()
    tenants = _read(path)
    existing = {t.id: t for t in tenants.tenants}
    if tenant_id in existing and policy_given:
        raise SystemExit(
            f"sentdp-admin: tenant {tenant_id!r} exists: new-key only adds a key to it, "
            f"so {', '.join(policy_given)} would be ignored; change its limits with "
            f"`sentdp-admin set-tenant --tenant {tenant_id} ...`, its accountant by "
            f"editing {path}"
        )
    if tenant_id in existing:
        current = existing[tenant_id]
        updated = current.model_copy(update={"key_sha256": [*current.key_sha256, hash_key(key)]})
    else:
        if not NEW_TENANT_ID.fullmatch(tenant_id):
            raise SystemExit(
                "sentdp-admin: invalid tenant: a new tenant's id is 1 to 64 letters, digits, "
                "'.', '_' and '-', starting with a letter or digit"
            )
        updated = Tenant(
            id=tenant_id,
            key_sha256=[hash_key(key)],
            max_epsilon=max_epsilon,
            group_size=group_size,
            budget=budget,
            **(accountant or {}),
        )
    existing[tenant_id] = updated
    _write(path, TenantsFile(tenants=list(existing.values())))
    return key


def revoke_keys(path: Path, tenant_id: str, key: str | None) -> int:
    """Remove one key (``key``) or every key (None) of a tenant; returns how many went."""
    with _editing(path):
        return _revoke_keys(path, tenant_id, key)


def _revoke_keys(path: Path, tenant_id: str, key: str | None) -> int:
    tenants = _read(path)
    existing = {t.id: t for t in tenants.tenants}
    if tenant_id not in existing:
        raise SystemExit(f"sentdp-admin: no tenant {tenant_id!r} in {path}")
    current = existing[tenant_id]
    if key is not None and not key.isascii():  # no key is (and a lone surrogate cannot hash)
        raise SystemExit(f"sentdp-admin: that key is not one of the keys of tenant {tenant_id!r}")
    kept = [] if key is None else [h for h in current.key_sha256 if h != hash_key(key)]
    removed = len(current.key_sha256) - len(kept)
    if key is not None and removed == 0:
        raise SystemExit(f"sentdp-admin: that key is not one of the keys of tenant {tenant_id!r}")
    existing[tenant_id] = current.model_copy(update={"key_sha256": kept})
    _write(path, TenantsFile(tenants=list(existing.values())))
    return removed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sentdp-admin", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    key = commands.add_parser("new-key", help="add a tenant or an API key; prints the key")
    key.add_argument("--tenant", required=True)
    key.add_argument("--key-file", type=Path, help="also write the key to this file (mode 600)")
    policy = key.add_argument_group(
        "a new tenant's policy", "refused for a tenant that exists: see set-tenant"
    )
    _limits(policy, defaults=True)
    policy.add_argument(
        "--composition",
        choices=["sequential", "per-document"],
        help="sequential (default): every release counts for every document; per-document: "
        "requests name each document's stable id (see the README)",
    )
    policy.add_argument("--accounting", choices=["pure", "zcdp"], help="default: pure")
    policy.add_argument("--delta", type=float, help="delta of (B, delta); required with zcdp")
    policy.add_argument("--period-days", type=int, help="renew budgets every this many days")
    change = commands.add_parser(
        "set-tenant",
        help="change a tenant's limits (running servers re-read the tenants file within a "
        "second); its accountant is changed by editing the tenants file",
    )
    change.add_argument("--tenant", required=True)
    _limits(change, defaults=False)
    revoke = commands.add_parser("revoke-key", help="remove API keys of a tenant")
    revoke.add_argument("--tenant", required=True)
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="the API key to revoke")
    which.add_argument("--key-file", type=Path, help="a file holding the API key to revoke")
    which.add_argument("--all", action="store_true", help="revoke every key of the tenant")
    commands.add_parser("purge", help="delete expired idempotency rows now")
    prune = commands.add_parser(
        "prune",
        help="delete charge rows settled more than --settled-days days ago, and per-document "
        "spends of past periods: history no budget check reads (no spend changes)",
    )
    prune.add_argument(
        "--settled-days",
        type=float,
        required=True,
        help="keep the charges settled within this many days (reserved ones are always kept)",
    )
    commands.add_parser(
        "recount-replies",
        help="count each tenant's stored reply bytes again (after a rolling upgrade from "
        "schema 4, once no older replica is left)",
    )
    for name, text in (
        ("budget", "print a user's spend and what is left of the budget (JSON)"),
        ("new-period", "start a new budget period for a user (their spend back to 0)"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--tenant", required=True, help="the tenant's id")
        sub.add_argument("--user", required=True, help="the user's id, as requests name it")
    return parser


NEW_TENANT = {"max_epsilon": 10.0, "group_size": 1, "budget": 100.0}
"""A new tenant's limits where ``new-key`` is not given them."""


def _limits(parser: Any, defaults: bool) -> None:
    """The options of a tenant's limits (unset: None, so that a given one can be told)."""
    shown = {
        name: f" (default {value:g})" if defaults else "" for name, value in NEW_TENANT.items()
    }
    parser.add_argument(
        "--max-epsilon",
        type=float,
        help=f"the largest epsilon one request may ask for{shown['max_epsilon']}",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        help="g: how many segments of a user's text one guarantee covers; every release is "
        f"charged g times its epsilon{shown['group_size']}",
    )
    parser.add_argument(
        "--budget",
        type=float,
        help=f"B: each user's limit of charged epsilon per period{shown['budget']}",
    )


def set_limits(path: Path, tenant_id: str, limits: dict[str, Any]) -> tuple[Tenant, Tenant]:
    """Change an existing tenant's max epsilon, group size or budget in the tenants file;
    the tenant before and after."""
    with _editing(path):
        return _set_limits(path, tenant_id, limits)


def weakened(before: Tenant, after: Tenant) -> list[str]:
    """What of a change lets a user's releases in the current period add up to more than
    the old limits allowed."""
    return [
        text
        for text, weaker in (
            ("the budget is raised", after.budget > before.budget),
            ("the group size is lowered", after.group_size < before.group_size),
        )
        if weaker
    ]


def _set_limits(path: Path, tenant_id: str, limits: dict[str, Any]) -> tuple[Tenant, Tenant]:
    tenants = _read(path)
    existing = {t.id: t for t in tenants.tenants}
    if tenant_id not in existing:
        raise SystemExit(f"sentdp-admin: no tenant {tenant_id!r} in {path}")
    before = existing[tenant_id]
    try:
        updated = Tenant.model_validate(before.model_dump() | limits)
    except ValidationError as error:
        raise SystemExit(f"sentdp-admin: invalid tenant: {problems_of(error)}") from None
    except ValueError as error:
        raise SystemExit(f"sentdp-admin: invalid tenant: {error}") from None
    existing[tenant_id] = updated
    _write(path, TenantsFile(tenants=list(existing.values())))
    return before, updated


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as error:
        raise SystemExit(f"sentdp-admin: {error}") from None
    try:
        _command(args, settings)
    except OSError as error:  # a state folder that cannot be made or written, say
        where = f" ({error.filename})" if error.filename else ""
        raise SystemExit(f"sentdp-admin: {error.strerror or error}{where}") from None


def _command(args: argparse.Namespace, settings: ServiceSettings) -> None:
    if args.command == "new-key":
        new_tenant_key(args, settings.tenants_file, _state_files(settings))
        return
    if args.command == "set-tenant":
        change_tenant(args, settings.tenants_file)
        return
    if args.command == "revoke-key":
        try:
            key = args.key_file.read_text().strip() if args.key_file else args.key
        except (OSError, UnicodeDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise SystemExit(
                f"sentdp-admin: cannot read the key file {args.key_file}: {why}"
            ) from None
        removed = revoke_keys(settings.tenants_file, args.tenant, None if args.all else key)
        print(f"revoked {removed} key(s) of tenant {args.tenant}", file=sys.stderr)
        return
    known = None
    if args.command not in ("purge", "recount-replies", "prune"):
        known = {t.id: t for t in _read(settings.tenants_file).tenants}.get(args.tenant)
        if known is None:
            raise SystemExit(
                f"sentdp-admin: no tenant {args.tenant!r} in {settings.tenants_file} "
                f"({WHERE_THE_SERVER_KEEPS_IT})"
            )
    try:
        _on_ledger(args, settings.ledger_url, settings.ledger_schema, known)
    except _database_errors() as error:
        raise SystemExit(f"sentdp-admin: the ledger failed: {_database_problem(error)}") from None


def _database_problem(error: Exception) -> str:
    """What a driver's error says, where that cannot hold a password: SQLite's messages
    name no URL, while libpq's quote parts of a URL it cannot parse (a password with a raw
    ``%`` or ``@``), so PostgreSQL's are not shown."""
    if isinstance(error, sqlite3.Error):
        return f"{type(error).__name__}: {error}"
    return (
        f"{type(error).__name__} from PostgreSQL (its message is not shown: it can quote "
        "SENTDP_LEDGER_URL, password included); check that the server is running and that the "
        "URL is valid, with special characters of the password percent-encoded"
    )


def _database_errors() -> tuple[type[Exception], ...]:
    """The database drivers' own errors (a server that cannot be reached, a file that is
    not a database)."""
    errors: list[type[Exception]] = [sqlite3.Error]
    try:
        import psycopg
    except ImportError:  # the postgres extra is not installed
        return tuple(errors)
    return (*errors, psycopg.Error)


def _on_ledger(args: argparse.Namespace, url: str, schema: str, known: Tenant | None) -> None:
    """The commands that read or change the ledger."""
    try:  # a ledger that is not there is the wrong one, not an empty one
        ledger = open_ledger(url, schema, create=False)
    except LedgerMissingError as missing:
        raise SystemExit(f"sentdp-admin: {missing} ({WHERE_THE_SERVER_KEEPS_IT})") from None
    except ValueError as wrong:  # an unsupported URL, named by its scheme alone
        raise SystemExit(f"sentdp-admin: {wrong}") from None
    if args.command == "purge":
        purged = ledger.purge_expired()
        # their bytes out of the files a backup copies, holding writers back 0.1 s at most
        if purged and not ledger.scrub(SCRUB_WAIT_SECONDS):
            print(
                "sentdp-admin: another connection kept reading, so the purged rows' bytes may "
                "stay in the SQLite write-ahead log until a server's timer or SQLite clears it",
                file=sys.stderr,
            )
        print(json.dumps({"purged_idempotency_rows": purged}))
        return
    if args.command == "prune":
        if not 0 <= args.settled_days < math.inf:
            raise SystemExit("sentdp-admin: --settled-days must be a number of days, 0 or more")
        pruned = ledger.prune_history(args.settled_days * 86_400)
        if any(pruned.values()) and not ledger.scrub(SCRUB_WAIT_SECONDS):
            print(
                "sentdp-admin: another connection kept reading, so the pruned rows' bytes may "
                "stay in the SQLite write-ahead log until its next checkpoint (run the command "
                "again once nothing reads, e.g. after a backup)",
                file=sys.stderr,
            )
        print(
            json.dumps(
                {
                    "pruned_charge_rows": pruned["charges"],
                    "pruned_document_rows": pruned["documents"],
                }
            )
        )
        return
    if args.command == "recount-replies":
        ledger.recount_stored_replies()
        print(json.dumps({"recounted": True}))
        return
    assert known is not None
    checked_user(args.user)
    if args.command == "new-period":
        account = ledger.new_period(args.tenant, args.user)
    else:  # as the tenant's next request will find it
        account = ledger.account(args.tenant, args.user, known.policy)
    view = budget_view(account, known.policy)  # the fields of the HTTP /budget
    print(json.dumps({"tenant": account.tenant, **view.model_dump(mode="json", exclude_none=True)}))


WHERE_THE_SERVER_KEEPS_IT = (
    "sentdp-admin reads the server's SENTDP_LEDGER_URL, SENTDP_LEDGER_SCHEMA and "
    "SENTDP_TENANTS_FILE, or SENTDP_STATE_DIR for the SQLite ledger and tenants file; for the "
    "server of `bash .ci/serve`: SENTDP_STATE_DIR=.sentdp"
)


def change_tenant(args: argparse.Namespace, tenants_file: Path) -> None:
    """``set-tenant``: change a tenant's limits, print them, warn where they weaken."""
    limits = {name: getattr(args, name) for name in NEW_TENANT if getattr(args, name) is not None}
    if not limits:
        raise SystemExit("sentdp-admin: set-tenant needs --max-epsilon, --group-size or --budget")
    before, tenant = set_limits(tenants_file, args.tenant, limits)
    for change in weakened(before, tenant):
        print(
            f"sentdp-admin: warning: {change}: releases already made in a user's current "
            "period now count against looser limits, so the period's guarantee is weaker "
            "than the old limits promised",
            file=sys.stderr,
        )
    print(json.dumps({"tenant": tenant.id, **{n: getattr(tenant, n) for n in NEW_TENANT}}))


def checked_user(user: str) -> str:
    """``user`` if the server accepts it as a user id: one it refuses names no account (it
    would read as unspent)."""
    try:
        return TypeAdapter(UserId).validate_python(user)
    except ValidationError as error:
        reason = error.errors()[0]["msg"]
        raise SystemExit(f"sentdp-admin: the server refuses that user id: {reason}") from None


def _state_files(settings: ServiceSettings) -> dict[str, Path]:
    """The files a key file must never replace, by what they are."""
    files = {
        "the tenants file": settings.tenants_file,
        "the idempotency secret": settings.idempotency_secret_file,
    }
    if settings.ledger_url.startswith("sqlite:///"):
        ledger = settings.ledger_url[len("sqlite:///") :]
        files["the ledger"] = Path(ledger)
        for companion in ("-wal", "-shm", "-journal"):  # SQLite's, beside it
            files["the ledger's " + companion[1:] + " file"] = Path(ledger + companion)
    return files


def _check_key_file(path: Path, state: dict[str, Path]) -> None:
    """Refuse a --key-file that would replace anything but an earlier key file: written over
    the tenants file, the key would have taken every tenant with it."""
    for what, state_file in state.items():
        try:
            same = path.resolve() == state_file.resolve()
        except (OSError, RuntimeError):  # a symlink loop
            raise SystemExit(f"sentdp-admin: --key-file {path} cannot be resolved") from None
        with contextlib.suppress(OSError):
            same = same or path.samefile(state_file)
        if same:
            raise SystemExit(f"sentdp-admin: --key-file {path} is {what}; nothing was changed")
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_file():
        raise SystemExit(
            f"sentdp-admin: --key-file {path} exists and is not a plain file; nothing was changed"
        )
    if path.lstat().st_uid != os.geteuid():  # its owner would be given the new key
        raise SystemExit(
            f"sentdp-admin: --key-file {path} belongs to another user; nothing was changed"
        )
    try:
        with path.open("rb") as existing:
            held = existing.read(1024)
    except OSError as error:
        raise SystemExit(
            f"sentdp-admin: --key-file {path} exists and cannot be read ({error.strerror}); "
            "nothing was changed"
        ) from None
    if not re.fullmatch(rb"sdp_[A-Za-z0-9_-]+\n?", held):
        raise SystemExit(
            f"sentdp-admin: --key-file {path} exists and does not hold one API key; it is not "
            "replaced, and nothing was changed"
        )


def new_tenant_key(args: argparse.Namespace, tenants_file: Path, state: dict[str, Path]) -> None:
    """``new-key``: add the key (and the tenant), print it once, write it to --key-file. The
    policy options describe a new tenant; for one that exists they are refused, never
    ignored (``set-tenant`` changes its limits)."""
    accountant = {
        "composition": args.composition or "sequential",
        "accounting": args.accounting or "pure",
        "delta": args.delta,
        "period_days": args.period_days,
    }
    given = [
        "--" + name.replace("_", "-")
        for name in (*NEW_TENANT, "composition", "accounting", "delta", "period_days")
        if getattr(args, name) is not None
    ]

    def given_or_default(name: str) -> Any:
        value = getattr(args, name)
        return NEW_TENANT[name] if value is None else value

    # The key file first: a key is valid only once its holder has it.
    secret = new_key()
    if args.key_file:
        _check_key_file(args.key_file, state)
        try:
            write_private(args.key_file, secret + "\n")
        except OSError as error:
            raise SystemExit(
                f"sentdp-admin: cannot write the key file {args.key_file}: "
                f"{error.strerror or error}; nothing was changed"
            ) from None
    try:
        add_key(
            tenants_file,
            args.tenant,
            given_or_default("max_epsilon"),
            int(given_or_default("group_size")),
            given_or_default("budget"),
            accountant,
            given,
            secret,
        )
    except BaseException as error:  # the key was not added: its file must not suggest it was
        if args.key_file:
            args.key_file.unlink(missing_ok=True)
        if isinstance(error, ValidationError):
            raise SystemExit(f"sentdp-admin: invalid tenant: {problems_of(error)}") from None
        if isinstance(error, ValueError):
            raise SystemExit(f"sentdp-admin: invalid tenant: {error}") from None
        raise
    print(secret)
    print(f"tenant {args.tenant} saved in {tenants_file}", file=sys.stderr)


if __name__ == "__main__":
    main()
