"""State that must outlive a container: the ledger, the tenants file, the idempotency secret.

A container's own filesystem goes with the container. An SQLite ledger there would reset
every user's spent epsilon to zero when the container is recreated: silently, and in the
direction that weakens the guarantee. So in a container the service refuses to start unless
each of these files lies on a mounted volume (or the ledger is PostgreSQL), and says how to
mount one; ``SENTDP_ALLOW_EPHEMERAL_STATE=true`` allows it for demos.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from service.settings import ServiceSettings

MOUNTINFO = Path("/proc/self/mountinfo")


class EphemeralStateError(RuntimeError):
    """The service would keep budgets where a recreated container loses them."""


def in_container() -> bool:
    """True inside an image BentoML built, or any Docker or Podman container."""
    if os.environ.get("BENTOML_CONTAINERIZED", "").lower() == "true":
        return True
    return Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()


VOLATILE = frozenset({"overlay", "fuse.fuse-overlayfs", "aufs", "tmpfs", "ramfs"})
"""Filesystems that end with the container (its writable layer) or with any restart (memory).
A container whose root is a real disk (a VM-like sandbox) keeps its state there."""


def mounts(mountinfo: Path = MOUNTINFO) -> dict[str, str]:
    """Mount point -> filesystem type in this process's mount namespace (mountinfo's fifth
    field, unescaped, and the type after the `` - `` separator); a later mount over the same
    point wins."""
    found: dict[str, str] = {}
    for line in mountinfo.read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields = head.split(" ")
        if len(fields) > 4 and tail:
            found[fields[4].encode().decode("unicode_escape")] = tail.split(" ")[0]
    return found


def mount_of(path: Path, points: Iterable[str]) -> str:
    """The mount point that holds ``path`` (the longest one above it)."""
    resolved = str(path.resolve())
    above = [p for p in points if resolved == p or resolved.startswith(p.rstrip("/") + "/")]
    return max(above, key=len, default="/")


def survives(path: Path, table: dict[str, str]) -> bool:
    """Whether ``path``'s folder is on a mount that outlives the container: not the
    container's own layer and not in memory. The folder, not the file: SQLite writes ``-wal``
    and ``-shm`` files and the tenants file is replaced by a rename beside it, so a
    single-file bind mount is not enough."""
    return table.get(mount_of(path.parent, table), "overlay") not in VOLATILE


def state_files(settings: ServiceSettings) -> dict[str, Path]:
    """The files whose loss loses state: the SQLite ledger (not PostgreSQL's), the tenants
    file and the idempotency secret."""
    files = {
        "SENTDP_TENANTS_FILE": settings.tenants_file,
        "SENTDP_IDEMPOTENCY_SECRET_FILE": settings.idempotency_secret_file,
    }
    if settings.ledger_url.startswith("sqlite:///"):
        files["SENTDP_LEDGER_URL"] = Path(settings.ledger_url[len("sqlite:///") :])
    return files


def check_state_survives(
    settings: ServiceSettings, container: bool | None = None, mountinfo: Path = MOUNTINFO
) -> None:
    """Refuse to start in a container whose state would be lost with it."""
    if settings.allow_ephemeral_state or not (in_container() if container is None else container):
        return
    table = mounts(mountinfo)
    lost = {name: path for name, path in state_files(settings).items() if not survives(path, table)}
    if lost:
        listed = "; ".join(f"{name} -> {path}" for name, path in lost.items())
        raise EphemeralStateError(
            "refusing to start: in this container these files are not in a folder on a "
            f"persistent volume and would be lost with it ({listed}); a lost ledger resets every "
            "user's spent epsilon to zero. Mount a volume and keep them there, e.g. "
            "`docker run -v sentdp-state:/state -e SENTDP_STATE_DIR=/state ...` (or use a "
            "PostgreSQL ledger); SENTDP_ALLOW_EPHEMERAL_STATE=true allows it for a demo"
        )
