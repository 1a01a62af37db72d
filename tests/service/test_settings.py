"""Service settings whose defaults depend on the machine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sentdp.errors import SettingsError
from service.settings import (
    ServiceSettings,
    boot_settings,
    cgroup_cpu_quota,
    default_gateway_workers,
    default_worker_processes,
    load_settings,
    own_cgroup,
    usable_cpus,
)


@pytest.mark.parametrize(("cpus", "expected"), [(1, 1), (2, 1), (3, 2), (4, 2), (64, 2)])
def test_one_gateway_process_on_two_cores_two_above(cpus: int, expected: int) -> None:
    assert default_gateway_workers(cpus) == expected


@pytest.mark.parametrize(
    ("cpus", "gateways", "workers"),
    [(2, 1, 1), (4, 2, 1), (8, 4, 2), (16, 8, 4), (64, 8, 4)],
)
def test_a_gpu_deployment_gets_the_processes_measured_on_an_h100(
    cpus: int, gateways: int, workers: int
) -> None:
    assert default_gateway_workers(cpus, gpu=True) == gateways
    assert default_worker_processes(cpus) == workers


DEPLOYMENT = (
    "SENTDP_DEVICE",
    "SENTDP_WORKER_GPUS",
    "SENTDP_GATEWAY_WORKERS",
    "SENTDP_WORKER_PROCESSES",
    "SENTDP_WORKER_THREADS",
)


def deployment(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]) -> None:
    """Exactly ``variables`` of the settings that size a deployment, the others unset."""
    for name in DEPLOYMENT:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(
    ("variables", "gpu"),
    [
        ({}, False),
        ({"SENTDP_DEVICE": "cpu"}, False),
        ({"SENTDP_WORKER_GPUS": "1"}, True),  # the GPU image
        ({"SENTDP_DEVICE": "cuda"}, True),
        ({"SENTDP_DEVICE": "cuda:1"}, True),
        ({"SENTDP_WORKER_GPUS": "1", "SENTDP_DEVICE": "cpu"}, False),  # the GPU image on a CPU
        ({"SENTDP_WORKER_GPUS": "1", "SENTDP_DEVICE": "auto"}, True),  # auto is the default
        ({"SENTDP_DEVICE": "auto"}, False),
    ],
)
def test_process_counts_follow_the_device_the_deployment_names(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], gpu: bool
) -> None:
    deployment(monkeypatch, variables)
    settings = ServiceSettings()
    assert settings.names_a_gpu is gpu
    assert (settings.gateway_count(16), settings.worker_count(16)) == ((8, 4) if gpu else (2, 1))
    assert (settings.gateway_count(2), settings.worker_count(2)) == (1, 1)
    monkeypatch.setenv("SENTDP_WORKER_PROCESSES", "3")
    monkeypatch.setenv("SENTDP_GATEWAY_WORKERS", "5")
    assert (ServiceSettings().gateway_count(16), ServiceSettings().worker_count(16)) == (5, 3)
    monkeypatch.setenv("SENTDP_WORKER_PROCESSES", "0")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        ServiceSettings()


def test_an_explicit_gateway_count_wins_and_zero_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SENTDP_GATEWAY_WORKERS", "3")
    assert ServiceSettings().gateway_workers == 3
    monkeypatch.delenv("SENTDP_GATEWAY_WORKERS")
    assert ServiceSettings().gateway_workers is None
    monkeypatch.setenv("SENTDP_GATEWAY_WORKERS", "0")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        ServiceSettings()


def test_encoder_rows_are_32_on_every_device_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SENTDP_ENCODE_BATCH_SIZE", raising=False)
    assert ServiceSettings().encoder_rows("cpu") == 32
    assert ServiceSettings().encoder_rows("cuda:0") == 32
    monkeypatch.setenv("SENTDP_ENCODE_BATCH_SIZE", "48")
    assert ServiceSettings().encoder_rows("cpu") == 48
    assert ServiceSettings().encoder_rows("cuda") == 48
    assert ServiceSettings().fixed_batch_rows("cuda") == 48
    assert ServiceSettings().fixed_batch_rows("cpu") == 8  # SENTDP_CPU_FIXED_BATCH_SIZE


def test_a_tenants_bytes_in_flight_default_to_eight_bodies_and_admit_the_largest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("SENTDP_TENANT_INFLIGHT_BYTES", "SENTDP_MAX_BODY_BYTES"):
        monkeypatch.delenv(name, raising=False)
    assert ServiceSettings().inflight_bytes() == 8 * (4 * 1024 * 1024 + 16384)
    monkeypatch.setenv("SENTDP_MAX_BODY_BYTES", str(64 * 1024 * 1024))
    assert ServiceSettings().inflight_bytes() == 8 * (64 * 1024 * 1024 + 16384)  # follows it
    monkeypatch.setenv("SENTDP_TENANT_INFLIGHT_BYTES", str(64 * 1024 * 1024 + 16383))
    with pytest.raises(ValueError, match="largest body could never be admitted"):
        ServiceSettings()
    monkeypatch.setenv("SENTDP_TENANT_INFLIGHT_BYTES", str(64 * 1024 * 1024 + 16384))
    assert ServiceSettings().inflight_bytes() == 64 * 1024 * 1024 + 16384


def test_the_body_timeout_stays_below_the_gateways_request_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SENTDP_WORKER_MAX_LATENCY_MS", raising=False)
    monkeypatch.setenv("SENTDP_BODY_TIMEOUT_S", "149.9")  # 2 x 60 s + 30 s is BentoML's
    assert ServiceSettings().body_timeout_s == 149.9
    monkeypatch.setenv("SENTDP_BODY_TIMEOUT_S", "150")
    with pytest.raises(ValueError, match="SENTDP_BODY_TIMEOUT_S must stay below"):
        ServiceSettings()


def test_the_gateway_gives_up_a_worker_call_after_the_request_timeout_and_before_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.9 x the pending window (when a worker call is given up) must exceed the gateway's
    request timeout (150 s by default), so only a cancelled request's call is ever given up."""
    monkeypatch.delenv("SENTDP_WORKER_MAX_LATENCY_MS", raising=False)
    monkeypatch.setenv("SENTDP_IDEMPOTENCY_PENDING_SECONDS", "166.7")
    assert ServiceSettings().idempotency_pending_seconds == 166.7
    monkeypatch.setenv("SENTDP_IDEMPOTENCY_PENDING_SECONDS", "166.6")  # 0.9 x 166.6 < 150
    with pytest.raises(ValueError, match=r"PENDING_SECONDS x 0\.9 must exceed"):
        ServiceSettings()


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "200000 100000\n"}, 2.0),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4.0),
        ({}, None),
    ],
)
def test_a_cgroup_cpu_quota_limits_the_cores_counted(
    tmp_path: Path, files: dict[str, str], quota: float | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota
    everything = usable_cpus(tmp_path / "none")
    expected = everything if quota is None else min(everything, math.ceil(quota))
    assert usable_cpus(tmp_path) == expected


@pytest.mark.parametrize(
    ("membership", "own"),
    [
        ("0::/system.slice/sentdp.service\n", "/system.slice/sentdp.service"),
        ("0::/\n", "/"),  # a container's own cgroup namespace
        ("4:memory:/x\n1:cpu:/\n", "/"),  # cgroup v1 only: its quota is read at the mount
        (None, "/"),
    ],
)
def test_the_process_own_cgroup_is_read_from_its_membership(
    tmp_path: Path, membership: str | None, own: str
) -> None:
    if membership is not None:
        (tmp_path / "cgroup").write_text(membership)
    assert own_cgroup(tmp_path / "cgroup") == own


def test_a_cpu_quota_above_the_process_own_cgroup_limits_it_too(tmp_path: Path) -> None:
    """A systemd unit's CPUQuota, or its slice's: the smallest limit on the way up counts."""
    mount = tmp_path / "fs"
    unit = mount / "system.slice" / "sentdp.service"
    unit.mkdir(parents=True)
    (mount / "cpu.max").write_text("max 100000\n")
    (mount / "system.slice" / "cpu.max").write_text("300000 100000\n")
    (unit / "cpu.max").write_text("max 100000\n")
    own = "/system.slice/sentdp.service"
    assert cgroup_cpu_quota(mount, own) == 3.0
    (unit / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(mount, own) == 1.5
    # a cgroup outside the namespace's root ("/../x"): only the mount is read, never above it
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert cgroup_cpu_quota(mount, "/../system.slice/sentdp.service") is None
    assert cgroup_cpu_quota(mount) is None  # the root sets none
    (tmp_path / "cgroup").write_text(f"0::{own}\n")
    everything = usable_cpus(mount, tmp_path / "none")
    assert usable_cpus(mount, tmp_path / "cgroup") == min(everything, 2)


def test_a_bad_setting_is_named_and_no_setting_value_is_quoted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pydantic's own message quotes values (a too-short metrics token whole, and for a rule
    over several settings all of them, the ledger URL's password among them), and the server
    prints it to its log when it fails to start."""
    password, token = "hunter2-ledger-password", "short-token"
    monkeypatch.setenv("SENTDP_LEDGER_URL", f"postgresql://sentdp:{password}@db/sentdp")
    monkeypatch.setenv("SENTDP_METRICS_TOKEN", token)
    boot_settings.cache_clear()
    for read in (load_settings, boot_settings):
        with pytest.raises(SettingsError) as error:
            read()
        assert error.value.__context__ is None  # pydantic's error would still quote them
        assert "SENTDP_METRICS_TOKEN: String should have at least 16 characters" in str(error.value)
        assert token not in str(error.value)
        assert password not in str(error.value)
    monkeypatch.setenv("SENTDP_METRICS_TOKEN", token * 2)
    monkeypatch.setenv("SENTDP_BODY_TIMEOUT_S", "100000")
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert "the settings together: SENTDP_BODY_TIMEOUT_S must stay below" in str(error.value)
    assert password not in str(error.value)
    assert "100000" not in str(error.value)
    boot_settings.cache_clear()


def test_an_empty_state_dir_is_unset_not_the_current_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SENTDP_STATE_DIR", "")
    for name in ("SENTDP_TENANTS_FILE", "SENTDP_LEDGER_URL", "SENTDP_IDEMPOTENCY_SECRET_FILE"):
        monkeypatch.delenv(name, raising=False)
    settings = ServiceSettings()
    assert settings.state_dir is None
    assert settings.tenants_file.is_absolute()
    assert settings.tenants_file != Path("tenants.json").absolute()


def test_a_bad_setting_that_others_default_from_is_the_only_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger URL, tenants file and idempotency secret default from other settings;
    pydantic adds an error for each default it did not compute, which hid the real one."""
    for name in ("SENTDP_TENANTS_FILE", "SENTDP_LEDGER_URL", "SENTDP_IDEMPOTENCY_SECRET_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SENTDP_ALLOW_EPHEMERAL_STATE", "maybe")
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert str(error.value) == (
        "a SENTDP_* setting is not valid: SENTDP_ALLOW_EPHEMERAL_STATE: Input should be a valid "
        "boolean, unable to interpret input"
    )


@pytest.mark.parametrize(
    ("variables", "cpus", "threads"),
    [
        ({}, 2, 2),  # one CPU worker on this project's 2 cores: the measured default
        ({}, 1, 1),  # a container limited to one core (docker run --cpus 1)
        ({"SENTDP_WORKER_PROCESSES": "2"}, 2, 1),  # two workers on 2 cores: a core each
        ({"SENTDP_WORKER_PROCESSES": "3"}, 2, 1),  # at least one
        ({}, 16, 2),  # more than 2 a worker is not measured: not the default
        ({"SENTDP_WORKER_GPUS": "1"}, 16, 2),  # four GPU workers on 16 cores
        ({"SENTDP_WORKER_GPUS": "1"}, 4, 2),  # one GPU worker on 4 cores
        ({"SENTDP_WORKER_PROCESSES": "2", "SENTDP_WORKER_THREADS": "4"}, 2, 4),  # as asked
    ],
)
def test_encoder_threads_never_outnumber_the_cores_unless_asked(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], cpus: int, threads: int
) -> None:
    deployment(monkeypatch, variables)
    assert ServiceSettings().encoder_threads(cpus) == threads


def test_encoder_threads_count_the_cores_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import service.settings as module

    deployment(monkeypatch, {"SENTDP_WORKER_PROCESSES": "2"})
    monkeypatch.setattr(module, "usable_cpus", lambda: 2)
    assert ServiceSettings().encoder_threads() == 1
    monkeypatch.setattr(module, "usable_cpus", lambda: 4)
    assert ServiceSettings().encoder_threads() == 2
