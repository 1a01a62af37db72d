"""In a container, the service refuses to keep budgets where the container's end loses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.settings import ServiceSettings
from service.state import EphemeralStateError, check_state_survives, mount_of, mounts

MOUNTINFO = """\
611 520 0:52 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/x,upperdir=/y
612 611 0:55 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
620 611 8:1 /var/lib/docker/volumes/sentdp-state/_data /state rw,relatime - ext4 /dev/sda1 rw
621 611 8:1 /var/lib/docker/containers/abc/hosts /etc/hosts rw,relatime - ext4 /dev/sda1 rw
622 611 8:1 /data/my\\040state /srv/my\\040state rw,relatime - ext4 /dev/sda1 rw
623 611 0:60 / /scratch rw,relatime - tmpfs tmpfs rw
624 611 8:1 /data/ledger.sqlite3 /app/ledger.sqlite3 rw,relatime - ext4 /dev/sda1 rw
"""


@pytest.fixture
def mountinfo(tmp_path: Path) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return path


def settings(state: str, ledger: str | None = None, **extra: object) -> ServiceSettings:
    return ServiceSettings(
        ledger_url=ledger or f"sqlite:///{state}/ledger.sqlite3",
        tenants_file=Path(state) / "tenants.json",
        idempotency_secret_file=Path(state) / "idempotency-secret",
        **extra,
    )


def test_mount_points_are_read_and_unescaped(mountinfo: Path) -> None:
    table = mounts(mountinfo)
    points = list(table)
    assert points[:5] == ["/", "/proc", "/state", "/etc/hosts", "/srv/my state"]
    assert (table["/"], table["/state"], table["/scratch"]) == ("overlay", "ext4", "tmpfs")
    assert mount_of(Path("/state/ledger.sqlite3"), points) == "/state"
    assert mount_of(Path("/stateful/ledger.sqlite3"), points) == "/"  # a prefix is not a parent
    assert mount_of(Path("/srv/my state/x"), points) == "/srv/my state"


def test_state_on_the_container_filesystem_is_refused_with_what_to_do(mountinfo: Path) -> None:
    with pytest.raises(EphemeralStateError) as refused:
        check_state_survives(settings("/home/bentoml/.local/share/sentdp"), True, mountinfo)
    message = str(refused.value)
    assert "SENTDP_LEDGER_URL -> /home/bentoml/.local/share/sentdp/ledger.sqlite3" in message
    assert "SENTDP_TENANTS_FILE" in message
    assert "docker run -v sentdp-state:/state -e SENTDP_STATE_DIR=/state" in message


def test_one_file_left_behind_is_enough_to_refuse(mountinfo: Path) -> None:
    mixed = settings("/state").model_copy(update={"tenants_file": Path("/app/tenants.json")})
    with pytest.raises(EphemeralStateError, match=r"SENTDP_TENANTS_FILE -> /app/tenants\.json"):
        check_state_survives(mixed, True, mountinfo)


def test_state_on_a_volume_postgres_a_demo_flag_or_no_container_start(mountinfo: Path) -> None:
    check_state_survives(settings("/state"), True, mountinfo)
    check_state_survives(settings("/srv/my state"), True, mountinfo)
    on_root = "/home/bentoml/state"
    postgres = settings("/state", ledger="postgresql://sentdp@db/sentdp")
    check_state_survives(postgres, True, mountinfo)
    with pytest.raises(EphemeralStateError):
        check_state_survives(
            settings("/state", ledger=f"sqlite:///{on_root}/ledger.sqlite3"), True, mountinfo
        )
    check_state_survives(settings(on_root, allow_ephemeral_state=True), True, mountinfo)
    check_state_survives(settings(on_root), False, mountinfo)


def test_memory_and_single_file_mounts_do_not_count(mountinfo: Path) -> None:
    """tmpfs ends with the container; a bind-mounted ledger file leaves SQLite's -wal and
    -shm files (recent debits) on the container's own filesystem."""
    with pytest.raises(EphemeralStateError, match="SENTDP_LEDGER_URL"):
        check_state_survives(settings("/scratch"), True, mountinfo)
    single = settings("/state", ledger="sqlite:////app/ledger.sqlite3")
    with pytest.raises(EphemeralStateError, match=r"/app/ledger\.sqlite3"):
        check_state_survives(single, True, mountinfo)


def test_a_container_whose_root_is_a_real_disk_keeps_state_there(tmp_path: Path) -> None:
    """Some sandboxes are containers on a VM disk: their root is not the container's layer."""
    vm = tmp_path / "mountinfo"
    vm.write_text("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n")
    check_state_survives(settings("/tmp/sentdp"), True, vm)


def test_state_dir_moves_every_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENTDP_STATE_DIR", "/state")
    for name in ("SENTDP_LEDGER_URL", "SENTDP_TENANTS_FILE", "SENTDP_IDEMPOTENCY_SECRET_FILE"):
        monkeypatch.delenv(name, raising=False)
    loaded = ServiceSettings()
    assert loaded.ledger_url == "sqlite:////state/ledger.sqlite3"
    assert loaded.tenants_file == Path("/state/tenants.json")
    assert loaded.idempotency_secret_file == Path("/state/idempotency-secret")
