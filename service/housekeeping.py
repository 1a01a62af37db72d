"""The gateway's housekeeping timer: expired idempotency rows (stored replies, with their
embeddings and user ids) leave the ledger on time whether or not charged requests come.

Reservations purge too (:meth:`~service.ledger.sql.SqlLedger.purge_due`), but only a
process that receives them; this timer asks the ledger every :data:`HOUSEKEEPING_SECONDS`
whether its minute's purge is due, and once stored replies have been deleted removes their
bytes from the ledger's files, at most once a minute
(:meth:`~service.ledger.sql.SqlLedger.housekeep`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

HOUSEKEEPING_SECONDS = 15.0
"""How often a gateway process asks its ledger whether a purge is due (one a minute, see
:data:`~service.ledger.sql.PURGE_INTERVAL_SECONDS`): an expired row goes within about 75 s of
its window's end while purges succeed (a failed one is retried a minute later)."""

logger = logging.getLogger("sentdp.service")


async def keep_house(
    housekeep: Callable[[], Awaitable[int]], chunk: int, interval: float = HOUSEKEEPING_SECONDS
) -> None:
    """Call ``housekeep`` (it returns the rows it purged) every ``interval`` seconds, and at
    once again after a full ``chunk`` (more rows are due). A failure is logged with its stack
    and the timer goes on; cancel the task to stop it."""
    while True:
        try:
            purged = await housekeep()
        except Exception:
            logger.warning("housekeeping failed; it runs again in %g s", interval, exc_info=True)
            purged = 0
        await asyncio.sleep(0 if purged >= chunk else interval)


def start(housekeep: Callable[[], Awaitable[int]], chunk: int) -> asyncio.Task[None]:
    """The timer as a task of the running loop; its end other than by cancellation (which
    :func:`keep_house` never does on its own) is logged as an error."""
    task = asyncio.create_task(keep_house(housekeep, chunk), name="sentdp-housekeeping")
    task.add_done_callback(ended)
    return task


def ended(task: asyncio.Task[None]) -> None:
    """Log a housekeeping task that stopped while the process runs on."""
    if task.cancelled():
        return
    error = task.exception()
    logger.error(
        "housekeeping stopped: expired idempotency rows are purged only by reservations now",
        exc_info=(type(error), error, error.__traceback__) if error is not None else None,
    )
