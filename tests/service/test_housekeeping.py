"""The gateway's housekeeping timer: it goes on after failures, takes the next chunk at
once, and says so when it stops."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import traceback

import pytest

from service import housekeeping


def logged_stack(record: logging.LogRecord) -> str:
    """The stack a record carries: as ``exc_info``, or folded into its message by sentdp's
    redaction filter (installed once a test has configured the service's logging)."""
    if record.exc_info is not None:
        return "".join(traceback.format_exception(*record.exc_info))
    return record.getMessage()


def test_the_timer_survives_a_failure_and_takes_a_full_chunk_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    results: list[int | Exception] = [RuntimeError("database is locked"), 5, 3, 0]
    calls: list[float] = []

    async def housekeep() -> int:
        calls.append(time.monotonic())
        result = results[len(calls) - 1] if len(calls) <= len(results) else 0
        if isinstance(result, Exception):
            raise result
        return result

    async def run() -> None:
        task = asyncio.create_task(housekeeping.keep_house(housekeep, chunk=5, interval=0.2))
        while len(calls) < 4:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.WARNING, logger="sentdp.service"):
        asyncio.run(run())
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.2  # after the failure: the next turn, not never
    assert gaps[1] < 0.1  # after a full chunk (5 of 5) more rows are due: at once
    assert gaps[2] >= 0.2  # after a partial chunk: the next turn
    (failure,) = [r for r in caplog.records if "housekeeping failed" in r.getMessage()]
    assert "RuntimeError" in logged_stack(failure)


def test_a_timer_that_stops_on_its_own_is_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run() -> asyncio.Task[None]:
        async def fails() -> None:
            raise ValueError("a bug")

        task = asyncio.create_task(fails())
        await asyncio.gather(task, return_exceptions=True)
        return task

    task = asyncio.run(run())
    with caplog.at_level(logging.ERROR, logger="sentdp.service"):
        housekeeping.ended(task)
    (record,) = [r for r in caplog.records if "housekeeping stopped" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert "ValueError" in logged_stack(record)
