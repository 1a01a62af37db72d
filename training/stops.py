"""Ctrl-C and SIGTERM during ``sentdp-train``: they unwind the run, so its scratch folders (the
staged bundle holds the training vocabulary) are removed; they wait while a model enters the
store, so it is never half-written; and once the model is in the store they are noted and
ignored, so the run ends with the tag and exit status 0 instead of a failure for a model that
exists."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stops:
    """The handler of the stop signals for one run (install it in the main thread)."""

    def __init__(self) -> None:
        self.saved = False
        self.ignored = False
        self._stopping = False
        self._holding = False
        self._pending: int | None = None
        self._before: dict[int, Any] = {}

    def install(self) -> None:
        """Handle the stop signals, except one the process was started to ignore (``nohup``,
        a job started with ``&``)."""
        for number in STOP_SIGNALS:
            if signal.getsignal(number) not in (signal.SIG_IGN, None):
                self._before[number] = signal.signal(number, self._handle)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced (for callers that run on)."""
        for number, handler in self._before.items():
            signal.signal(number, handler)
        self._before.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.saved:
            self.ignored = True
        elif self._holding:
            if self._pending is None:
                # os.write, not print: the main thread may be inside a print of its own
                os.write(2, b"stopping once the model is in the store\n")
            self._pending = signum
        elif not self._stopping:  # a second stop must not cut the first one's clean-up short
            self._stopping = True
            raise SystemExit(128 + signum)

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Hold stops while the model enters the store. Once it has, the run is done, and a
        stop that came meanwhile is ignored; if saving fails, its error ends the run."""
        self._holding = True
        try:
            yield
            self.saved = True
            self.ignored = self._pending is not None
        finally:
            self._holding = False
