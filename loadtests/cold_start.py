"""Cold start and peak memory of the whole server, per bundle, without the full benchmark.

Run: ``.venv/bin/python loadtests/cold_start.py TAG [TAG ...] [--documents N --concurrency C]
[--server-env 'VAR=VALUE ...' ...]``

For each bundle (and each ``--server-env`` setting, alternating): launch ``bentoml serve``
(the default gateway processes: one on 2 cores; one worker), time launch to the first
/readyz 200, send one BBC News test document alone at once (the first request's latency),
then BBC News test documents (16 at concurrency 4 by default; 160 at 32 is the full load of
``bench_service.py``), and print the cold start, the worker's encoder mode, the first
request's seconds, the sentences/s, the peak resident memory of all server processes
(sampled every 0.5 s), and the checks of the buckets the start-up probes miss that the
worker's own thread ran (``encoder_bucket_checked``): how many, their seconds, and when the
last ended, counted from readiness. Then where the cold start went, from the server's log:
the time from launch to the worker's start (processes, imports), each phase of the worker's
start (``worker_start_phases``; with several worker processes, the last to start), the later
checks (from then to the last check logged), the gateway's warm-up of the batching
dispatcher (``worker_dispatcher_warmed``) and the rest (readiness polling). Other settings
come from the environment, e.g. ``SENTDP_ENCODE_BATCH_SIZE``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from loadtests.bench_service import RssSampler, encoder_mode, load, load_documents, serve
from tests.support import LOG_FIELDS, Server, log_events


def _epoch(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00")).timestamp()


def _thread_checks(server: Server) -> list[dict[str, object]]:
    """The bucket checks the worker's own thread ran after its start-up (its log)."""
    logged = log_events(server.log, "encoder_bucket_checked") if server.log else []
    return [e for e in logged if e.get("when") == "later"]


def later_checks(server: Server, ready: float) -> str:
    """The buckets the worker's own thread checked after its start-up (its log), their
    seconds, and when the last check ended, in seconds after ``ready`` (Unix time;
    negative: before)."""
    events = _thread_checks(server)
    if not events:
        return "no bucket checked by the worker's thread"
    spent = sum(float(str(e["seconds"])) for e in events)
    return (
        f"{len(events)} buckets checked by the worker's thread in {spent:.2f} s, the last "
        f"ending {_epoch(events[-1]) - ready:.1f} s after ready"
    )


class NoPhasesError(LookupError):
    """The server's log holds no ``worker_start_phases``."""


def _start_phases(server: Server) -> list[dict[str, Any]]:
    """Every worker process's ``worker_start_phases``, in log order (:class:`NoPhasesError`
    when there is none)."""
    if server.log is None:
        raise NoPhasesError("no server log")
    phases = log_events(server.log, "worker_start_phases")
    if not phases:
        raise NoPhasesError("no worker_start_phases in the log")
    return phases


def start_parts(
    server: Server, ready: float, phases: list[dict[str, Any]] | None = None
) -> dict[str, float]:
    """Where the cold start went, in seconds, from the server's log: launch to the worker's
    start, each phase of it, the checks of the worker's thread, the dispatcher's warm-up,
    and the rest until ``ready`` (Unix time); they add up to the cold start. Log times have
    millisecond resolution. ``phases``: the log's ``worker_start_phases`` if already read.
    :class:`NoPhasesError` when the log lacks the worker's phases."""
    if server.log is None:
        raise NoPhasesError("no server log")
    phases = phases or _start_phases(server)
    seconds = {k: float(v) for k, v in phases[-1].items() if k not in LOG_FIELDS}
    launched = ready - server.cold_start_seconds
    parts = {"launch to worker start": _epoch(phases[-1]) - sum(seconds.values()) - launched}
    parts.update(seconds)
    later = _thread_checks(server)
    # from the last worker's start to the last check: with several worker processes their
    # checks overlap, so their seconds do not add up to the wall time they took
    parts["later checks"] = max(0.0, _epoch(later[-1]) - _epoch(phases[-1])) if later else 0.0
    warmed = log_events(server.log, "worker_dispatcher_warmed")
    parts["dispatcher warm-up"] = float(warmed[-1]["seconds"]) if warmed else 0.0
    parts["rest"] = server.cold_start_seconds - sum(parts.values())
    return parts


def start_breakdown(server: Server, ready: float) -> str:
    """:func:`start_parts` as one line, or why there is none."""
    try:
        phases = _start_phases(server)
    except NoPhasesError as missing:
        return str(missing)
    parts = start_parts(server, ready, phases)
    text = [f"{name} {value:.2f}" for name, value in parts.items()]
    if len(phases) > 1:
        text[0] += f" (the last of {len(phases)} worker processes)"
    return "cold start, seconds: " + ", ".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="bundle tags, served one after another")
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--server-env",
        nargs="+",
        default=[""],
        help="settings of the server, one string per server ('' for none)",
    )
    args = parser.parse_args()
    documents = load_documents(args.documents + 1, seed=1)
    first, documents = documents[:1], documents[1:]
    for model in args.models:
        for setting in args.server_env:
            extra = dict(pair.split("=", 1) for pair in setting.split())
            with tempfile.TemporaryDirectory(prefix="sentdp-cold-") as scratch:
                server = serve(model, Path(scratch), batching=True, extra=extra)
                ready = time.time()
                sampler = RssSampler(server)
                sampler.start()
                try:
                    started = time.perf_counter()
                    alone = load(server, first, 1)
                    first_seconds = time.perf_counter() - started
                    result = load(server, documents, args.concurrency)
                    time.sleep(1)
                finally:
                    sampler.running = False
                    sampler.join()
                    server.stop()
                print(
                    f"{model}{' ' + setting if setting else ''}: cold start "
                    f"{server.cold_start_seconds:.1f} s, encoder mode {encoder_mode(server)}, "
                    f"first request {first_seconds:.2f} s ({alone['failures']} failed), "
                    f"{args.documents} documents at concurrency {args.concurrency}: "
                    f"{result['sentences_per_s']:.1f} sentences/s, {result['failures']} "
                    f"failed, peak RSS {sampler.peak / 2**20:.0f} MiB; "
                    f"{later_checks(server, ready)}\n  {start_breakdown(server, ready)}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
