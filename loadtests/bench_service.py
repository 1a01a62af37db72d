"""End-to-end throughput of the service against the encoder's own limit, in one run.

Run: ``.venv/bin/python loadtests/bench_service.py [--models TAG ...] [--batching-off]
[--device cuda] [--gateway-workers N ...] [--worker-processes N ...]``

1. raw encoders in this process, with the worker's thread count: sentence-transformers
   ``encode`` (torch; the "x st" column's reference) and sentdp's encoder for each bundle's
   backend (torch, onnx, onnx-int8), in plain length buckets and in fixed-shape batches
   (on CUDA: replayed as CUDA graphs, and eager), all sentences at once and one document at
   a time;
2. the service over HTTP (``bentoml serve``: the default gateway processes, one on 2 cores,
   or each count of --gateway-workers; one worker process, or each of --worker-processes)
   for each bundle at concurrency 1, 8 and 32, one real BBC News test
   document per request: sentences/s, documents/s, p50/p95/p99 latency; "x own" compares
   with sentdp's encoder of the same backend in the worker's mode (one document at a time
   for concurrency 1), measured before and after the servers (the mean is the reference);
3. where the time goes: mean seconds per request in the gateway, per ledger operation, per
   worker call, and per worker batch (encoding, everything before sampling), from the
   service's own histograms on /metrics, and how many cores each process kept busy (the
   client shares the machine with the server);
4. with --batching-off, the same with adaptive batching off.

Also reported: cold start (launch to /readyz 200) and the peak resident memory of the whole
server. Figures are medians where repeated; the ratio column is the one to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for tests.support
from service.settings import load_settings
from tests.support import TENANTS, Server, log_events, write_tenants

THREADS = 2


def bbc_test_split() -> list[list[str]]:
    """Every BBC News test-split article in split order, as the service would split them."""
    from sentdp.text import TextLimits
    from training.datasets import REGISTRY, stratified_splits
    from training.settings import load_settings

    corpus = REGISTRY["bbc-news"](load_settings().cache_dir, TextLimits())
    return [list(corpus.documents[int(i)].sentences) for i in stratified_splits(corpus, 0).test]


def load_documents(count: int, seed: int) -> list[list[str]]:
    """Real documents: ``count`` BBC News test-split articles drawn with ``seed``."""
    test = bbc_test_split()
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(test), size=min(count, len(test)), replace=False)
    return [test[int(i)] for i in chosen]


def _rate(encode: Any, sentences: int) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        encode()
        times.append(time.perf_counter() - start)
    return sentences / statistics.median(times)


def raw_encoder_rates(
    documents: list[list[str]],
    model_dir: Path,
    backend: str,
    device: str = "cpu",
    only: set[str] | None = None,
    threadings: Sequence[str] = ("rows",),
) -> dict[str, float]:
    """Sentences/s of sentdp's encoder for ``backend`` in this process: all sentences at once
    (plain length buckets, and fixed-shape batches as the worker uses where the start-up
    check asks for them: on CUDA with deterministic kernels, which then stay on in this
    process), and one document at a time (the ceiling of concurrency 1), for an ONNX backend
    in each of ``threadings`` (``SENTDP_ENCODER_THREADING``). ``only``: these modes
    ("buckets", "fixed batches", "buckets, operators", ...) and no others."""
    from sentdp.encoders import open_encoder, use_deterministic_kernels

    sentences = [s for doc in documents for s in doc]
    settings = load_settings()  # the worker under test reads the same ones
    cuda = device.startswith("cuda")
    rates = {}
    modes = [("buckets", False, True, True), ("fixed batches", True, True, True)]
    if cuda and backend == "torch":  # the serving mode's graphs against eager passes
        modes.append(("fixed batches, graphs waited for one by one", True, True, False))
        modes.append(("fixed batches, eager", True, False, True))
    runs = [
        (mode + threading_suffix(backend, split), split, fixed, graphs, overlap)
        for mode, fixed, graphs, overlap in modes
        for split in (threadings if backend != "torch" else ("rows",))
    ]
    for mode, split, fixed, graphs, overlap in runs:
        if only is not None and mode not in only:
            continue
        rows = settings.fixed_batch_rows(device) if fixed else settings.encoder_rows(device)
        if fixed and cuda:
            use_deterministic_kernels()
        encoder = open_encoder(
            model_dir,
            backend,
            device,
            rows,
            fixed,
            threads=THREADS,
            cuda_graphs=graphs,
            onnx_threading=split,
            cpu_linear=settings.cpu_linear,
        )
        if not overlap:
            encoder.overlap_passes = False  # type: ignore[union-attr]
        encoder.warm_up()
        encoder.encode(sentences[:256])  # warm up
        rates[f"sentdp {backend} encoder, {mode}"] = _rate(
            lambda e=encoder: e.encode(sentences), len(sentences)
        )
        rates[f"sentdp {backend} encoder, {mode}, one doc at a time"] = _rate(
            lambda e=encoder: [e.encode(doc) for doc in documents], len(sentences)
        )
    return rates


def plain_rate(
    documents: list[list[str]], model_dir: Path, batch: int, device: str = "cpu"
) -> float:
    """sentence-transformers ``encode`` (torch) of the same sentences: the reference."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(THREADS)
    sentences = [s for doc in documents for s in doc]
    plain = SentenceTransformer(str(model_dir), device=device, local_files_only=True)
    plain.encode(sentences[:256], batch_size=batch)  # warm up
    return _rate(lambda: plain.encode(sentences, batch_size=batch), len(sentences))


BREAKDOWN = {
    "gateway": ("sentdp_charged_request_seconds", {"endpoint": "privatize"}),
    "ledger": ("sentdp_ledger_seconds", {}),
    "worker call": ("sentdp_worker_call_seconds", {}),
    "worker batch": ("sentdp_worker_batch_seconds", {"stage": "total"}),
    "encode": ("sentdp_worker_batch_seconds", {"stage": "encode"}),
    "prepare": ("sentdp_worker_batch_seconds", {"stage": "prepare"}),
}
"""Where a request's time goes, from the service's own histograms (sums and counts)."""


def histogram_totals(server: Server) -> dict[str, tuple[float, float]]:
    """(sum, count) of each BREAKDOWN histogram on /metrics now."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.support import METRICS_TOKEN

    text = httpx.get(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    ).text
    totals: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for name, (metric_name, labels) in BREAKDOWN.items():
            if family.name != metric_name:
                continue
            total, count = totals.get(name, (0.0, 0.0))
            for sample in family.samples:
                if any(sample.labels.get(k) != v for k, v in labels.items()):
                    continue
                if sample.name == f"{metric_name}_sum":
                    total += sample.value
                elif sample.name == f"{metric_name}_count":
                    count += sample.value
            totals[name] = (total, count)
    return totals


def cpu_seconds(server: Server) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the benchmark's client (this process) and
    by each kind of server process: on a small machine they share the encoder's cores."""
    import psutil

    used: Counter[str] = Counter()
    arbiter = server.process.pid if server.process is not None else None
    for process in [psutil.Process(), *server._tree()]:
        try:  # a process may exit between listing and reading
            command = " ".join(process.cmdline())
            times = process.cpu_times()
        except psutil.Error:
            continue
        seconds = times.user + times.system
        if process.pid == os.getpid():
            kind = "client"  # client processes report their own load's CPU (load())
        elif process.pid == arbiter:
            kind = "arbiter"
        elif "sentdp-worker" in command:
            kind = "worker"
        elif "--service-name sentdp" in command:
            kind = "gateway"
        else:
            kind = "other"
        used[kind] += seconds
    return dict(used)


def reference_mode(mode: str, backend: str = "torch", threading: str = "rows") -> str:
    """The in-process encoder mode ("buckets" or "fixed batches", and an ONNX encoder's
    threading when not the default) that a worker's encoder mode (:func:`encoder_mode`) is
    compared with."""
    return ("fixed batches" if "fixed" in mode else "buckets") + threading_suffix(
        backend, threading
    )


def threading_suffix(backend: str, threading: str) -> str:
    """How a mode's name says an ONNX encoder's threading other than the default ``rows``."""
    return "" if backend == "torch" or threading == "rows" else f", {threading}"


def encoder_mode(server: Server) -> str:
    """The worker's encoder mode from its start-up log (cpu, cpu-fixed-batch, ...), with
    the linear layers' library of a torch encoder on the CPU (``cpu (onednn)``)."""
    chosen = log_events(server.log, "encoder_batch_invariance") if server.log else []
    if not chosen:
        return "unknown"
    mode, linear = str(chosen[0].get("mode")), chosen[0].get("cpu_linear")
    return f"{mode} ({linear})" if linear else mode


class RssSampler(threading.Thread):
    """The server's largest resident memory (every process), sampled every ``interval`` s."""

    def __init__(self, server: Server, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.interval = interval
        self.peak = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.server.rss_bytes())
            time.sleep(self.interval)


async def drive(
    url: str, documents: list[list[str]], concurrency: int
) -> tuple[float, float, list[float], Counter[int]]:
    """``concurrency`` users posting ``documents`` one per request until none is left: the
    start and end (``time.monotonic``, one clock for every process of the machine), each
    request's latency and the failures by status."""
    headers = {"Authorization": f"Bearer {TENANTS[0].key}"}
    queue: asyncio.Queue[tuple[int, list[str]]] = asyncio.Queue()
    for n, doc in enumerate(documents):
        queue.put_nowait((n, doc))
    latencies: list[float] = []
    failures: Counter[int] = Counter()

    async def user(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            n, doc = queue.get_nowait()
            body = {"user": f"bench-{n}", "epsilon": 6.0, "documents": [{"sentences": doc}]}
            start = time.perf_counter()
            response = await http.post("/privatize", json=body)
            latencies.append(time.perf_counter() - start)
            if response.status_code != 200:
                failures[response.status_code] += 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as http:
        start = time.monotonic()
        await asyncio.gather(*(user(http) for _ in range(concurrency)))
        end = time.monotonic()
    return start, end, latencies, failures


def _drive_in_process(
    url: str, documents: list[list[str]], concurrency: int, ready: Any
) -> tuple[tuple[float, float, list[float], Counter[int]], float]:
    """:func:`drive` in a client process of its own, starting with the others; with the CPU
    seconds the load took there (the process's start-up left out)."""
    ready.wait()
    start = time.process_time()
    run = asyncio.run(drive(url, documents, concurrency))
    return run, time.process_time() - start


def load(
    server: Server, documents: list[list[str]], concurrency: int, processes: int = 1
) -> dict[str, Any]:
    """Throughput and latency of ``concurrency`` users sending ``documents``, from this
    process or split over ``processes`` client processes (one Python process drives about
    one core of HTTP: on a machine with cores to spare it can be the bottleneck)."""
    processes = max(1, min(processes, concurrency, len(documents)))
    elsewhere = 0.0  # CPU seconds of the client processes' loads
    if processes == 1:
        runs = [asyncio.run(drive(server.url, documents, concurrency))]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, ProcessPoolExecutor(processes, context) as pool:
            ready = manager.Barrier(processes)
            shares = [
                (documents[k::processes], concurrency // processes + (k < concurrency % processes))
                for k in range(processes)
            ]
            futures = [
                pool.submit(_drive_in_process, server.url, docs, users, ready)
                for docs, users in shares
            ]
            finished = [future.result() for future in futures]
            runs = [run for run, _ in finished]
            elsewhere = sum(seconds for _, seconds in finished)
    wall = max(end for _, end, _, _ in runs) - min(start for start, _, _, _ in runs)
    latencies = [latency for _, _, run, _ in runs for latency in run]
    failures = sum((failed for *_, failed in runs), Counter[int]())
    quantiles = np.quantile(latencies, [0.5, 0.95, 0.99])
    return {
        "documents_per_s": len(documents) / wall,
        "sentences_per_s": sum(len(d) for d in documents) / wall,
        "p50": quantiles[0],
        "p95": quantiles[1],
        "p99": quantiles[2],
        "failures": sum(failures.values()),
        "failure_statuses": dict(failures),
        "wall": wall,
        "client processes cpu": elsewhere,
    }


def serve(
    model: str,
    folder: Path,
    batching: bool,
    device: str = "cpu",
    gateways: int | None = None,
    workers: int = 1,
    extra: dict[str, str] | None = None,
) -> Server:
    """The service on ``model`` with ``workers`` worker processes, each with the encoder
    threads the service gives it by default (``SENTDP_WORKER_THREADS`` unset: the cores ÷
    the workers, at most 2, as THREADS on 2 cores); ``extra`` variables are set for the
    server alone."""
    tenants = write_tenants(folder / "tenants.json")
    variables = ",".join(f"{var}={value}" for var, value in sorted((extra or {}).items()))
    digest = hashlib.sha256(variables.encode()).hexdigest()[:8]  # a ledger and log per server
    name = f"{model.replace(':', '-')}-{batching}-{gateways}-{workers}-{digest}"
    env = {
        "SENTDP_MODEL": model,
        "SENTDP_TENANTS_FILE": str(tenants),
        "SENTDP_LEDGER_URL": f"sqlite:///{folder / f'ledger-{name}.sqlite3'}",
        "SENTDP_ADAPTIVE_BATCHING": str(batching).lower(),
        "SENTDP_WORKER_PROCESSES": str(workers),
        "SENTDP_DEVICE": device,
    }
    if gateways is not None:
        env["SENTDP_GATEWAY_WORKERS"] = str(gateways)
    env |= extra or {}
    return Server(env, log=folder / f"server-{name}.log").start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=[os.environ.get("SENTDP_MODEL", "sentdp-bbc-news:latest")],
        help="bundles to serve one after another (e.g. one per encoder backend)",
    )
    parser.add_argument("--documents", type=int, default=96, help="documents per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--batching-off", action="store_true", help="also serve with adaptive batching off"
    )
    parser.add_argument("--device", default="cpu", help="the encoder's device: cpu or cuda")
    parser.add_argument(
        "--gateway-workers",
        type=int,
        nargs="+",
        default=[None],
        help="gateway processes, one server each (default: the service's own default)",
    )
    parser.add_argument(
        "--worker-processes",
        type=int,
        nargs="+",
        default=[1],
        help="worker processes, one server each, sharing the encoder threads",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="processes that send the load (default 1: on 2 cores more would take the "
        "server's; on a GPU machine one process's HTTP client is the limit above ~32 users)",
    )
    parser.add_argument(
        "--server-env",
        nargs="+",
        default=[""],
        metavar="VAR=VALUE,...",
        help="variables for the servers alone, one server per set (e.g. '' "
        "TOKENIZERS_PARALLELISM=false): compares settings in one run",
    )
    args = parser.parse_args()
    variants = [
        dict(pair.split("=", 1) for pair in spec.split(",") if pair) for spec in args.server_env
    ]
    default_threading = os.environ.get("SENTDP_ENCODER_THREADING", "rows")
    threadings = sorted(
        {v.get("SENTDP_ENCODER_THREADING", default_threading) for v in variants}, reverse=True
    )

    from training.store import load_from_store

    documents = load_documents(args.documents + 8, seed=1)
    warmup, measured = documents[:8], documents[8:]
    sentences = sum(len(d) for d in measured)
    print(
        f"{len(measured)} BBC News test documents, {sentences} sentences, {THREADS} threads, "
        f"device {args.device}"
    )
    bundles = {model: load_from_store(model) for model in args.models}
    first = next(iter(bundles.values()))
    reference = plain_rate(measured, first.encoder_dir, batch=64, device=args.device)
    raw: dict[str, float] = {"sentence-transformers encode (torch)": reference}
    for bundle in bundles.values():
        raw |= raw_encoder_rates(
            measured,
            bundle.encoder_dir,
            bundle.encoder_backend,
            args.device,
            threadings=threadings,
        )

    rows: list[tuple[str, str, dict[str, Any]]] = []
    starts: dict[str, float] = {}
    peaks: dict[str, int] = {}
    modes: dict[str, str] = {}
    references: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="sentdp-bench-") as scratch:
        for model, bundle in bundles.items():
            backend = bundle.encoder_backend
            servers = [
                (batching, gateways, workers, extra)
                for batching in ((True, False) if args.batching_off else (True,))
                for gateways in args.gateway_workers
                for workers in args.worker_processes
                for extra in variants
            ]
            for batching, gateways, workers, extra in servers:
                label = f"{backend}, batching {'on' if batching else 'off'}"
                if gateways is not None:
                    label += f", {gateways} gateways"
                if workers != 1:
                    label += f", {workers} workers"
                label += "".join(f", {var}={value}" for var, value in extra.items())
                try:
                    server = serve(
                        model, Path(scratch), batching, args.device, gateways, workers, extra
                    )
                except RuntimeError as error:  # the other servers' rows still count
                    print(f"{label}: the server did not start: {error}")
                    continue
                sampler = RssSampler(server)
                sampler.start()
                try:
                    starts[label] = server.cold_start_seconds
                    modes[label] = encoder_mode(server)
                    references[label] = reference_mode(
                        modes[label],
                        backend,
                        extra.get("SENTDP_ENCODER_THREADING", default_threading),
                    )
                    load(server, warmup, 4)
                    for concurrency in args.concurrency:
                        before = histogram_totals(server)
                        cpu_before = cpu_seconds(server)
                        result = load(server, measured, concurrency, args.client_processes)
                        cpu_after = cpu_seconds(server)
                        after = histogram_totals(server)
                        cpu_after["client"] += result["client processes cpu"]
                        result["cpu"] = {
                            kind: (cpu_after[kind] - cpu_before.get(kind, 0.0)) / result["wall"]
                            for kind in cpu_after
                        }
                        result["breakdown"] = {
                            name: (after[name][0] - before.get(name, (0, 0))[0])
                            / max(after[name][1] - before.get(name, (0, 0))[1], 1)
                            for name in after
                        }
                        result["batches"] = (
                            after["worker batch"][1] - before.get("worker batch", (0, 0))[1]
                        )
                        encoding = after.get("encode", (0, 0))[0] - before.get("encode", (0, 0))[0]
                        result["encoding share"] = encoding / result["wall"]
                        rows.append((backend, f"{label}, concurrency {concurrency}", result))
                finally:
                    sampler.running = False
                    sampler.join()
                    peaks[label] = sampler.peak
                    server.stop()

    # The encoder alone again, in each mode a server used: on a shared machine its speed
    # drifts within a run (by up to a quarter on a shared virtual machine), so "x own" compares
    # with the mean of the references before and after the servers.
    encoder_after: dict[str, float] = {}
    for bundle in bundles.values():
        used = {
            reference
            for label, reference in references.items()
            if label.startswith(f"{bundle.encoder_backend},")
        }
        if used:
            encoder_after |= raw_encoder_rates(
                measured,
                bundle.encoder_dir,
                bundle.encoder_backend,
                args.device,
                used,
                threadings,
            )
    own_reference = {name: (raw[name] + rate) / 2 for name, rate in encoder_after.items()}

    header = ("measurement", "sent/s", "docs/s", "x st", "x own", "p50 s", "p95 s", "p99 s", "fail")
    line = "{:58s} {:>8s} {:>7s} {:>6s} {:>6s} {:>7s} {:>7s} {:>7s} {:>5s}"
    print(line.format(*header))
    for name, rate in raw.items():
        print(f"{name:58s} {rate:8.1f} {'':>7s} {rate / reference:6.2f}")
    for backend, name, r in rows:
        fixed = references[name.rsplit(",", 1)[0]]
        alone = "one doc at a time" if name.endswith("concurrency 1") else ""
        own_name = f"sentdp {backend} encoder, {fixed}" + (f", {alone}" if alone else "")
        own = own_reference.get(own_name, raw[own_name])
        print(
            f"{name:58s} {r['sentences_per_s']:8.1f} {r['documents_per_s']:7.2f} "
            f"{r['sentences_per_s'] / reference:6.2f} {r['sentences_per_s'] / own:6.2f} "
            f"{r['p50']:7.2f} {r['p95']:7.2f} {r['p99']:7.2f} {r['failures']:5d}"
        )
        if r["failures"]:
            print(f"    failed requests by status: {r['failure_statuses']}")
    print()
    print('the encoder alone before and after the servers ("x own" compares with the mean)')
    print("{:58s} {:>8s} {:>8s} {:>8s}".format("measurement", "before", "after", "ratio"))
    for name, rate in encoder_after.items():
        print(f"{name:58s} {raw[name]:8.1f} {rate:8.1f} {rate / raw[name]:8.2f}")
    print()
    print("mean seconds per request (gateway, ledger operation, worker call) and per batch;")
    print("share: the part of the run's wall time the worker spent encoding (summed over worker")
    print("processes; taken at the same moments, so it does not drift with the machine as x own)")
    names = list(BREAKDOWN)
    print(
        "{:58s} ".format("measurement") + " ".join(f"{n:>12s}" for n in names) + "  batches   share"
    )
    for _, name, r in rows:
        cells = " ".join(f"{r['breakdown'].get(n, float('nan')):12.4f}" for n in names)
        print(f"{name:58s} {cells}  {r['batches']:7.0f} {r['encoding share']:7.2f}")
    print()
    kinds = ("worker", "gateway", "client", "arbiter", "other")
    print(f"cores busy during each run (of {len(os.sched_getaffinity(0))}), by process")
    print("{:58s} ".format("measurement") + " ".join(f"{k:>8s}" for k in kinds))
    for _, name, r in rows:
        print(f"{name:58s} " + " ".join(f"{r['cpu'].get(k, 0.0):8.2f}" for k in kinds))
    print()
    for label, seconds in starts.items():
        print(
            f"{label}: encoder mode {modes[label]}, cold start (launch to /readyz) "
            f"{seconds:.1f} s, peak RSS of the server {peaks[label] / 2**20:.0f} MiB"
        )


if __name__ == "__main__":
    main()
