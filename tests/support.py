"""Run a real sentdp server (``bentoml serve``) on loopback: for tests, benchmarks and load tests.

Test support, not shipped: it lives under ``tests/`` so that neither the wheel nor the Bento
carries it (it needs httpx and psutil, dev extras). The load tests import it too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil

from service.ledger import SqlLedger, open_ledger
from service.tenants import Tenant, TenantsFile, hash_key

if TYPE_CHECKING:
    import numpy as np

    from sentdp.labels import SentenceVote

REPO = Path(__file__).resolve().parent.parent  # the checkout (bentoml serve runs from here)
BENTOML = Path(sys.executable).parent / "bentoml"
METRICS_TOKEN = "sdp_test_metrics_token_0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class TenantSpec:
    id: str
    key: str
    max_epsilon: float
    group_size: int
    budget: float


TENANTS = (
    TenantSpec("acme", "sdp_test_acme_key_0123456789abcdef", 10.0, 1, 100.0),
    TenantSpec("other", "sdp_test_other_key_0123456789abcdef", 10.0, 2, 20.0),
    TenantSpec("tiny", "sdp_test_tiny_key_0123456789abcdef", 1.0, 1, 50.0),
    TenantSpec("zero", "sdp_test_zero_key_0123456789abcdef", 10.0, 1, 0.0),
)


def write_tenants(path: Path, tenants: tuple[TenantSpec, ...] = TENANTS) -> Path:
    content = TenantsFile(
        tenants=[
            Tenant(
                id=t.id,
                key_sha256=[hash_key(t.key)],
                max_epsilon=t.max_epsilon,
                group_size=t.group_size,
                budget=t.budget,
            )
            for t in tenants
        ]
    )
    path.write_text(content.model_dump_json())
    return path


def sqlite_server_env(
    folder: Path, model: str, tenants: tuple[TenantSpec, ...] = TENANTS, **extra: str
) -> dict[str, str]:
    """The settings of a server of ``model`` for ``tenants`` on an SQLite ledger in
    ``folder``, plus ``extra``."""
    return {
        "SENTDP_MODEL": model,
        "SENTDP_TENANTS_FILE": str(write_tenants(folder / "tenants.json", tenants)),
        "SENTDP_LEDGER_URL": f"sqlite:///{folder / 'ledger.sqlite3'}",
        **extra,
    }


def draws_server(folder: Path, model: str, tenants: list[Tenant], documents: int) -> Server:
    """A started server of ``model`` for ``tenants`` on an SQLite ledger in ``folder``, taking
    up to ``documents`` documents per request (for tests that draw many samples)."""
    (folder / "tenants.json").write_text(TenantsFile(tenants=tenants).model_dump_json())
    env = {
        "SENTDP_MODEL": model,
        "SENTDP_TENANTS_FILE": str(folder / "tenants.json"),
        "SENTDP_LEDGER_URL": f"sqlite:///{folder / 'ledger.sqlite3'}",
        "SENTDP_MAX_DOCUMENTS": str(documents),
    }
    return Server(env, log=folder / "server.log").start()


def private_home(shared: Path) -> Path:
    """A BENTOML_HOME of its own that shares ``shared``'s models and bentos.

    ``bentoml serve`` wipes ``$BENTOML_HOME/prometheus_multiproc_dir`` when it starts, so two
    servers on one home erase each other's metrics; each server gets its own home.
    """
    home = Path(tempfile.mkdtemp(prefix="sentdp-server-home-"))
    for part in ("models", "bentos"):
        (shared / part).mkdir(parents=True, exist_ok=True)
        (home / part).symlink_to(shared / part, target_is_directory=True)
    return home


FAULTY_TARGET = "tests.faulty_server:Gateway"
"""``bentoml serve``'s target for a server with the worker's test-only faults on (a string:
importing :mod:`tests.faulty_server` here would turn them on in the test process too)."""


@dataclass
class Server:
    """``bentoml serve`` in its own process group, configured by SENTDP_* variables."""

    env: dict[str, str]
    target: str = "service.gateway:Gateway"
    port: int = field(default_factory=free_port)
    log: Path | None = None
    cwd: Path = REPO
    process: subprocess.Popen[bytes] | None = None
    _log_offset: int = 0
    cold_start_seconds: float = 0.0
    home: Path | None = None
    probes: list[tuple[int | None, float]] = field(default_factory=list)
    """Every /readyz answer while starting: status (None: no answer in 30 s), seconds."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0, refused: str | None = None) -> Server:
        """Launch and wait for /readyz; with ``refused``, give up (RuntimeError) as soon as
        the log says so, instead of waiting out ``timeout`` for a server that never gets
        ready (a refusing worker is restarted, not exited)."""
        env = {**os.environ, **self.env}
        self.home = private_home(Path(env.get("BENTOML_HOME", Path.home() / "bentoml")))
        env["BENTOML_HOME"] = str(self.home)
        env.setdefault("SENTDP_METRICS_TOKEN", METRICS_TOKEN)
        env.setdefault("SENTDP_IDEMPOTENCY_SECRET_FILE", str(self.home / "idempotency-secret"))
        started = time.perf_counter()
        self._launch(env)
        deadline = time.monotonic() + timeout
        port_retries = 3
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                if port_retries and self._lost_port_race():
                    # free_port's port was taken by another process before bentoml bound it
                    port_retries -= 1
                    self.port = free_port()
                    self._launch(env)
                    continue
                raise RuntimeError(
                    f"bentoml serve exited with {self.process.returncode}: {self.tail()}"
                )
            asked = time.perf_counter()
            try:
                status = httpx.get(f"{self.url}/readyz", timeout=30).status_code
                self.probes.append((status, time.perf_counter() - asked))
                if status == 200:
                    self.cold_start_seconds = time.perf_counter() - started
                    return self
            except httpx.TimeoutException:
                self.probes.append((None, time.perf_counter() - asked))
            except httpx.HTTPError:
                pass  # not listening yet
            if refused is not None and refused in self._logged_since_launch():
                self.stop()
                raise RuntimeError(f"bentoml serve refused to start: {self.tail()}")
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"bentoml serve was not ready after {timeout} s: {self.tail()}")

    def _launch(self, env: dict[str, str]) -> None:
        self._log_offset = self.log.stat().st_size if self.log and self.log.is_file() else 0
        log = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(BENTOML), "serve", self.target, "--port", str(self.port), "--host", "127.0.0.1"],
            cwd=self.cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _lost_port_race(self) -> bool:
        """Whether the launch that just exited failed only because its port was in use."""
        return "Address already in use" in self._logged_since_launch()

    def _logged_since_launch(self) -> str:
        if not (self.log and self.log.is_file()):
            return ""
        with self.log.open("rb") as handle:
            handle.seek(self._log_offset)
            return handle.read().decode(errors="replace")

    def tail(self) -> str:
        if self.log and self.log.is_file():
            return self.log.read_text(errors="replace")[-3000:]
        return ""

    def _tree(self) -> list[psutil.Process]:
        if self.process is None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """kill -9 of the whole server: the arbiter and every worker process at once."""
        processes = self._tree()
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=30)
        if self.process is not None:
            self.process.wait(30)
        self._forget_home()

    def _forget_home(self) -> None:
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)  # the symlinks, not their targets
            self.home = None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self._forget_home()
            return
        processes = self._tree()
        self.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)
        _, alive = psutil.wait_procs(processes, timeout=15)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self._forget_home()

    def rss_bytes(self) -> int:
        """Resident memory of the whole server (arbiter, gateway and worker processes)."""
        total = 0
        for process in self._tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                total += process.memory_info().rss
        return total

    def worker_pids(self) -> list[int]:
        """Processes of this server that run the batched worker service."""
        return [p.pid for p in self._tree() if "sentdp-worker" in " ".join(p.cmdline())]


def client(server: Server, key: str | None, timeout: float = 120.0) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=timeout)


TEXT = (
    "Shares in the carmaker rose sharply on Monday. Analysts said the results beat "
    "expectations. The firm will raise its dividend. Its chief executive was upbeat."
)
"""A four-sentence document for requests."""


def privatize(  # type: ignore[no-untyped-def]
    server: Server, user: str, epsilon: float = 1.0, key: str = TENANTS[0].key, **body
):
    """POST /privatize of :data:`TEXT` for ``user``."""
    payload = {"user": user, "epsilon": epsilon, "documents": [{"text": TEXT}], **body}
    with client(server, key) as http:
        return http.post("/privatize", json=payload)


def ledger_of(server: Server) -> SqlLedger:
    return open_ledger(server.env["SENTDP_LEDGER_URL"])


def age_pending_keys(ledger: SqlLedger, seconds: float, key: str | None = None) -> None:
    """Make every idempotency key (or only ``key``) ``seconds`` older (instead of sleeping
    past a short timeout, which a loaded machine can overrun between two later steps)."""
    only = "" if key is None else " WHERE key = :k"
    with ledger.transaction() as cur:
        ledger._execute(
            cur,
            "UPDATE sentdp_idempotency SET created_at = created_at - :s" + only,
            {"s": seconds, "k": key},
        )


LOG_FIELDS = {"time", "level", "logger", "component", "event"}
"""The fields of every line of a server's JSON log; an event's own fields are the others."""


def log_events(log: Path, name: str) -> list[dict[str, Any]]:
    """The events called ``name`` in a server's JSON log, in order."""
    lines = log.read_text(errors="replace").splitlines()
    found = [json.loads(line) for line in lines if line.startswith("{") and name in line]
    return [event for event in found if event.get("event") == name]


def ledger_files_hold(folder: Path, marker: bytes) -> bool:
    """Whether any of an SQLite ledger's files in ``folder`` (the database, its WAL and
    shared memory) holds ``marker``: what a backup copying them would hold."""
    return any(marker in f.read_bytes() for f in folder.glob("ledger.sqlite3*"))


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error object of an error response (which holds nothing else)."""
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    return error


def read_journal(path: Path) -> set[int]:
    if not path.is_file():
        return set()
    return {int(line) for line in path.read_text().split()}


def dump(data: object) -> str:
    return json.dumps(data)


def cube_calibration(vote: SentenceVote) -> tuple[np.ndarray, np.ndarray]:
    """A scale and an offset per class for the ``cube_bundle_tag`` fixture: the logits of a
    short sentence brought to a spread of a few units (a confident vote's would floor every
    other class's cube vote to 0, calibrated or not), then scaled and shifted unevenly."""
    import numpy as np

    spread = 2 * np.linalg.norm(vote.weights, axis=1).max() + np.ptp(vote.bias)
    if vote.word_weights is not None:
        spread += 10 * np.abs(vote.word_weights).max()  # about ten words a sentence
    classes = vote.classes
    return np.linspace(0.5, 2.0, classes) * 4 / spread, np.linspace(1.0, -1.0, classes)


class Concurrency:
    """How many calls run at once per key, from any thread: ``most`` is each key's peak."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[Hashable, int] = {}
        self.most: dict[Hashable, int] = {}

    @contextlib.contextmanager
    def counting(self, key: Hashable) -> Iterator[None]:
        with self.lock:
            self.running[key] = self.running.get(key, 0) + 1
            self.most[key] = max(self.most.get(key, 0), self.running[key])
        try:
            yield
        finally:
            with self.lock:
                self.running[key] -= 1


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll until ``condition`` holds (ordering by state, not by sleeps a loaded CI can overrun)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.001)


def logged_events(records: Iterable[logging.LogRecord], event: str) -> list[dict[str, Any]]:
    """The fields of every structured log event named ``event`` (:func:`service.logs.log_event`)."""
    fields = (getattr(record, "sentdp_fields", {}) for record in records)
    return [f for f in fields if f.get("event") == event]


@contextlib.contextmanager
def json_server(answer: Callable[[str], tuple[Any, ...]]) -> Iterator[str]:
    """A local HTTP server that answers every POST with ``answer(path)``: a status, a body
    (sent as JSON, or as it is when it is bytes) and optionally a dict of extra headers;
    another service at a URL a client under test is given. Yields the URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answering(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, body, *extra = answer(self.path)
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (extra[0] if extra else {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
