"""The worker returns freed heap pages at most once per interval (each return walks the whole
heap: about 16 ms per lone document with ONNX Runtime int8 when done after every batch)."""

from __future__ import annotations

import pytest

from service import worker
from service.worker import MemoryTrim


def test_returns_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(worker, "_MALLOC_TRIM", calls.append)
    clock = iter([100.0, 100.5, 101.2, 101.3])
    trim = MemoryTrim(1.0, clock=lambda: next(clock))
    assert [trim() for _ in range(4)] == [True, False, True, False]
    assert calls == [0, 0]


def test_a_large_batch_returns_its_pages_whenever_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(worker, "_MALLOC_TRIM", calls.append)
    trim = MemoryTrim(60.0, clock=lambda: 100.0)
    assert trim(1) is True  # the first
    assert trim(MemoryTrim.LARGE_BATCH_SENTENCES - 1) is False
    assert trim(MemoryTrim.LARGE_BATCH_SENTENCES) is True
    assert len(calls) == 2


def test_interval_zero_returns_after_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(worker, "_MALLOC_TRIM", calls.append)
    trim = MemoryTrim(0.0)
    assert all(trim() for _ in range(3))
    assert len(calls) == 3


def test_the_real_trim_runs_where_glibc_has_it() -> None:
    if worker._MALLOC_TRIM is None:
        pytest.skip("not glibc")
    assert MemoryTrim(0.0)() is True
