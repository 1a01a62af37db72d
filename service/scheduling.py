"""Sharing the worker between tenants: bounded work in flight, and turns at the encoder.

A gateway process admits at most a fixed number of sentences in flight per tenant
(:class:`TenantLoad`; more is refused with 429 before anything is charged), and checks
(splits, tokenizes, signs) at most a few of a tenant's requests at once, with a bounded queue
(:class:`TenantChecks`): checking is CPU work done before a request is charged or counted.

The worker's encoder uses every core, so running two batches at once only makes both late.
:class:`FairGate` lets one computation run at a time; when it ends, the waiter whose key was
served least recently goes next (first come, first served within a key). Unbatched calls
(large requests) wait under their tenant's key and adaptive batches under one shared key, so
a tenant flooding large requests delays another tenant's request by at most one computation.
A waiter that gives up at its deadline learns whether its own key held the gate for at least
half of its wait: then it is late because of its own backlog, not other keys' work.
:class:`ComputeThread` runs those computations, and the encoder's start-up, on one thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

BATCH_KEY = "adaptive-batch"
"""The key under which adaptive batches (requests of several tenants) take their turns."""


@dataclass(frozen=True)
class Turn:
    """How a wait at the gate ended."""

    granted: bool
    """The gate is held for the body of ``with``; False: the deadline came first."""
    behind_own: bool = False
    """Not granted, and the same key held the gate for at least half of this waiter's wait:
    its own earlier work (served first within the key) is why it is late. A waiter already
    past its deadline on arrival waited for nothing and is never told so."""


class FairGate:
    """A lock granted round-robin over keys, FIFO within a key."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._busy = False
        self._holder: Hashable | None = None
        self._held_since = 0.0
        self._held: dict[Hashable, float] = {}
        """Seconds each key has held the gate, its current turn excluded."""
        self._waiting: list[tuple[Hashable, int]] = []
        self._last_served: dict[Hashable, int] = {}
        self._tickets = itertools.count()
        self._serves = itertools.count()

    @contextmanager
    def turn(self, key: Hashable, deadline: float | None = None) -> Iterator[Turn]:
        """Wait for this key's turn and hold the gate for the body (``granted``); at
        ``deadline`` (wall-clock seconds) stop waiting and hold nothing."""
        with self._condition:
            ticket = (key, next(self._tickets))
            arrived = time.monotonic()
            own_before = self._held_by(key, arrived)
            late_on_arrival = deadline is not None and deadline <= time.time()
            self._waiting.append(ticket)
            granted = self._wait(ticket, deadline)
            self._waiting.remove(ticket)
            if granted:
                self._busy = True
                self._holder = key
                self._held_since = time.monotonic()
                self._last_served[key] = next(self._serves)
            else:
                ended = time.monotonic()
                own = self._held_by(key, ended) - own_before
                behind_own = not late_on_arrival and own > 0 and own >= (ended - arrived) / 2
                self._condition.notify_all()  # the next waiter may be up now
        if not granted:
            yield Turn(False, behind_own)
            return
        try:
            yield Turn(True)
        finally:
            with self._condition:
                self._held[key] = self._held_by(key, time.monotonic())
                self._busy = False
                self._holder = None
                self._condition.notify_all()

    def _held_by(self, key: Hashable, now: float) -> float:
        """Seconds ``key`` has held the gate up to ``now`` (monotonic), its current turn
        included."""
        current = now - self._held_since if self._busy and self._holder == key else 0.0
        return self._held.get(key, 0.0) + current

    def _wait(self, ticket: tuple[Hashable, int], deadline: float | None) -> bool:
        """Wait (holding the condition) until ``ticket`` is next and the gate is free, or
        until the deadline; whether the turn came."""
        while self._busy or self._next() != ticket:
            left = None if deadline is None else deadline - time.time()
            if left is not None and left <= 0:
                return False
            self._condition.wait(left)
        return True

    def _next(self) -> tuple[Hashable, int]:
        return min(self._waiting, key=lambda t: (self._last_served.get(t[0], -1), t[1]))

    def waiting(self) -> int:
        """How many computations are waiting for their turn."""
        with self._condition:
            return len(self._waiting)


class ComputeThread:
    """One long-lived thread on which every encoder call of a process runs.

    torch's CPU kernels run in OpenMP teams, and libgomp gives each calling thread its own
    team. BentoML runs the worker's start-up on one thread and its calls on others, so the
    worker held two teams or more: more OpenMP threads than cores, at which libgomp makes
    idle team members sleep almost at once instead of spinning, and every parallel region
    then waits for them to wake. Measured on 2 cores with the same encoder (BBC News, 80
    documents): warm-up on one thread and encoding on another ran 117-133 sentences/s one
    document at a time and 158-194 in 14-document batches, against 133-152 and 201-205
    with both on one thread.
    """

    def __init__(self, name: str = "sentdp-compute") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args, **kwargs)`` on the compute thread; waits for it and returns its
        result or raises its exception."""
        return self._executor.submit(function, *args, **kwargs).result()


Call = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]
"""A queued call of :class:`FairExecutor`: its future, the function and its arguments."""


class FairExecutor:
    """A thread pool whose waiting calls are taken in turns over keys (tenants), first come,
    first served within a key, and whose calls of one key hold at most ``per_key`` threads.
    A key's backlog then delays another key's call by at most one call of each other key
    with calls waiting, and never keeps it from a free thread.

    Each submitted call puts one "run the next call" task on a
    :class:`~concurrent.futures.ThreadPoolExecutor`, which chooses the call only when a
    thread takes the task: the pool's threads, their start on first use and its draining of
    queued work at interpreter exit are the standard library's. A task that finds every
    waiting key at its ``per_key`` is deferred, and one deferred task is put back each time
    a call ends (freeing one thread of one key). A call cancelled before it starts never
    runs."""

    def __init__(self, threads: int, name: str, per_key: int | None = None) -> None:
        if threads < 1 or (per_key is not None and per_key < 1):
            raise ValueError(f"a fair executor needs threads >= 1, got {threads}, {per_key}")
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self.per_key = per_key if per_key is not None else threads
        self._lock = threading.Lock()
        self._waiting: dict[Hashable, deque[Call]] = {}
        self._turns: deque[Hashable] = deque()
        """The keys with calls waiting, the next to be served first."""
        self._running: dict[Hashable, int] = {}
        self._deferred = 0
        """Tasks that found every waiting key at its limit; put back as calls end."""
        self._closed = False

    def submit(self, key: Hashable, function: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``function(*args)`` under ``key``; its future."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            queue = self._waiting.get(key)
            if queue is None:
                queue = self._waiting[key] = deque()
                self._turns.append(key)
            queue.append((future, function, args))
            self._pool.submit(self._run_next)  # under the lock: a shutdown cannot come between
        return future

    def for_key(self, key: Hashable) -> Executor:
        """An :class:`~concurrent.futures.Executor` that queues every call under ``key``."""
        return _KeyedExecutor(self, key)

    def waiting(self) -> int:
        """Calls queued and not yet started."""
        with self._lock:
            return sum(len(queue) for queue in self._waiting.values())

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking calls (those queued still run) and, with ``wait``, wait for them."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=wait)

    def _take(self) -> tuple[Hashable, Call] | None:
        """The next call in turn whose key is below its limit (counted as running), or None
        (the task is deferred)."""
        with self._lock:
            for _ in range(len(self._turns)):
                key = self._turns.popleft()
                if self._running.get(key, 0) >= self.per_key:
                    self._turns.append(key)  # its turn waits for one of its calls to end
                    continue
                queue = self._waiting[key]
                call = queue.popleft()
                if queue:
                    self._turns.append(key)  # its next call after every other key's
                else:
                    del self._waiting[key]
                self._running[key] = self._running.get(key, 0) + 1
                return key, call
            self._deferred += 1
            return None

    def _run_next(self) -> None:
        """Run the next call in turn; then, while the pool takes no more tasks (shutting
        down), run here the deferred calls it would have taken."""
        while self._run_one():
            pass

    def _run_one(self) -> bool:
        """Run one call (or defer); whether a deferred task must run here because the pool
        refused it."""
        taken = self._take()
        if taken is None:
            return False
        key, (future, function, args) = taken
        try:
            if future.set_running_or_notify_cancel():
                try:
                    result = function(*args)
                except BaseException as error:  # handed to the caller, as an executor does
                    future.set_exception(error)
                else:
                    future.set_result(result)
        finally:
            with self._lock:
                left = self._running[key] - 1
                if left:
                    self._running[key] = left
                else:
                    del self._running[key]
                resume = self._deferred > 0
                self._deferred -= resume
        if not resume:  # this call's key has a thread to spare now: one deferred task may run
            return False
        try:
            self._pool.submit(self._run_next)
        except RuntimeError:  # the pool is shutting down: run it on this thread
            return True
        return False


class _KeyedExecutor(Executor):
    def __init__(self, fair: FairExecutor, key: Hashable) -> None:
        self._fair = fair
        self._key = key

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self._fair.submit(self._key, functools.partial(fn, **kwargs), *args)


class TenantLoad:
    """Work each tenant has in flight in this process, in padded tokens (one event loop: no
    lock). A request weighs at least ``limit // requests``, so a tenant has at most
    ``requests`` in flight however small they are: each costs two ledger writes whatever
    its size, and those writes are shared by every tenant. With ``requests=None`` amounts
    count as they are (the guard's bytes of request bodies)."""

    def __init__(self, limit: int, requests: int | None = 64) -> None:
        if limit < 1 or (requests is not None and requests < 1):
            raise ValueError(f"a load needs limit >= 1 and requests >= 1, got {limit}, {requests}")
        self.limit = limit
        self.least = 0 if requests is None else limit // requests
        self._inflight: dict[str, int] = {}

    def weight(self, cost: int) -> int:
        """What a request of ``cost`` tokens counts against the limit."""
        return max(cost, self.least)

    def try_acquire(self, tenant: str, cost: int) -> bool:
        current = self._inflight.get(tenant, 0)
        if current + self.weight(cost) > self.limit:
            return False
        self._inflight[tenant] = current + self.weight(cost)
        return True

    def release(self, tenant: str, cost: int) -> None:
        left = self._inflight.get(tenant, 0) - self.weight(cost)
        if left > 0:
            self._inflight[tenant] = left
        else:
            self._inflight.pop(tenant, None)


class TenantChecks:
    """Requests each tenant has being checked in this process: at most ``running`` at once,
    at most ``waiting`` more queued, beyond that refused (one event loop: no lock). A
    check's slot is given back only when its computation has ended, even if the request
    that started it is gone, so cancelling requests frees no CPU for more."""

    def __init__(self, running: int, waiting: int) -> None:
        if running < 1 or waiting < 0:
            raise ValueError(f"checks need running >= 1 and waiting >= 0, got {running}, {waiting}")
        self.running = running
        self.waiting = waiting
        self._present: dict[str, int] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}

    def try_enter(self, tenant: str) -> bool:
        """Count one more of ``tenant``'s requests in, unless its queue is full."""
        present = self._present.get(tenant, 0)
        if present >= self.running + self.waiting:
            return False
        self._present[tenant] = present + 1
        return True

    async def acquire(self, tenant: str) -> None:
        """Wait for a running slot (after :meth:`try_enter`); if cancelled meanwhile, the
        caller still calls :meth:`leave` with ``held=False``."""
        slots = self._slots.get(tenant)
        if slots is None:
            slots = self._slots[tenant] = asyncio.Semaphore(self.running)
        await slots.acquire()

    def leave(self, tenant: str, held: bool) -> None:
        """Count the request out, giving back its running slot if it ``held`` one."""
        if held:
            self._slots[tenant].release()
        left = self._present.get(tenant, 0) - 1
        if left > 0:
            self._present[tenant] = left
        else:
            self._present.pop(tenant, None)
            self._slots.pop(tenant, None)

    def in_queue(self, tenant: str) -> int:
        """The tenant's requests being checked or waiting to be."""
        return self._present.get(tenant, 0)


class TurnRefusedError(Exception):
    """The tenant's queue at a :class:`TenantChecks` gate is full."""


async def in_turn(
    gate: TenantChecks,
    pool: Executor,
    tenant: str,
    on_turn: Callable[[], None],
    function: Callable[..., Any],
    *args: Any,
) -> Any:
    """``function(*args)`` on ``pool`` in one of the tenant's turns at ``gate``
    (:class:`TurnRefusedError` when its queue there is full; ``on_turn`` may still refuse by
    raising once the turn comes). The turn comes back when the call has run (or was cancelled
    before it started), not when the caller stops waiting for it, however often the caller
    is cancelled: cancelling frees nothing."""
    if not gate.try_enter(tenant):
        raise TurnRefusedError(tenant)
    try:
        await gate.acquire(tenant)
    except BaseException:
        gate.leave(tenant, held=False)
        raise
    try:
        on_turn()
        running = pool.submit(contextvars.copy_context().run, function, *args)
    except BaseException:
        gate.leave(tenant, held=True)
        raise
    loop = asyncio.get_running_loop()
    running.add_done_callback(lambda _: loop.call_soon_threadsafe(gate.leave, tenant, True))
    return await asyncio.wrap_future(running)
