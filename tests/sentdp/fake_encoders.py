"""Fake encoders for the batch-invariance checks' tests: kernels that move a row only in
some layouts, so a check that misses a layout fails a test."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from sentdp.encoders import bucket_of, encode_in_buckets


class MovesAtFiveRows:
    """An encoder whose kernels change at one row count only, as ONNX Runtime's pooling did."""

    device, dim, max_tokens, batch_size, fixed_batch = "cpu", 4, 16, 8, False

    def encode(self, sentences):  # type: ignore[no-untyped-def]
        out = np.array([[len(s), s.count("e"), 1.0, 2.0] for s in sentences], dtype=np.float32)
        return out + np.float32(1e-6) if len(sentences) == 5 else out


CHAR_BUCKETS = (8, 16, 32, 64, 128, 256, 512)
FILLER = [ord(".")]

Fault = Callable[[int, list[list[int]], int, int, int], bool]
"""Whether a pass moves its row at a position: (bucket, the pass's rows, position, how many
passes of that bucket and how many of any bucket came before it in the same call)."""


def layout(bucket: int, real: int, position: int) -> Fault:
    """A kernel whose micro-tiles end at ``position`` when a pass holds ``real`` real rows."""
    return lambda length, rows, at, _, __: (length, real_rows(rows), at) == (bucket, real, position)


def real_rows(rows: list[list[int]]) -> int:
    return sum(row != FILLER for row in rows)


def in_bucket(bucket: int) -> Fault:
    """A kernel that moves every row of a pass of ``bucket`` holding at least two real rows."""
    return lambda length, rows, *_: length == bucket and real_rows(rows) >= 2


class FixedPasses:
    """An encoder in fixed-shape batches (or, with ``fixed=False``, plain buckets) whose tokens
    are characters (at most 512), run through sentdp's own passes
    (:func:`encode_in_buckets`), with a planted fault that moves a row by 1e-6."""

    device, dim, max_tokens = "cpu", 3, 512

    def __init__(self, rows: int, fault: Fault | None = None, fixed: bool = True) -> None:
        self.batch_size, self.fault, self.passes, self.fixed_batch = rows, fault, 0, fixed
        self._before: Counter[int] = Counter()
        self._earlier = 0

    def _ids(self, sentences):  # type: ignore[no-untyped-def]
        return [[ord(c) for c in s][: self.max_tokens] for s in sentences]

    def buckets_of(self, sentences):  # type: ignore[no-untyped-def]
        return [bucket_of(len(ids), CHAR_BUCKETS) for ids in self._ids(sentences)]

    def encode(self, sentences):  # type: ignore[no-untyped-def]
        out = np.empty((len(sentences), self.dim), dtype=np.float32)
        ids = self._ids(sentences)
        self._before, self._earlier = Counter(), 0
        filler = FILLER if self.fixed_batch else None
        return encode_in_buckets(ids, CHAR_BUCKETS, self.batch_size, filler, self._run, out)

    def _run(self, rows, length):  # type: ignore[no-untyped-def]
        self.passes += 1
        assert len(rows) == self.batch_size or not self.fixed_batch  # fixed: every pass full
        out = np.array([[sum(r) % 97 / 97, len(r) / 512, r[0] / 128] for r in rows], np.float32)
        for at in range(len(rows)):
            before = self._before[length]
            if self.fault is not None and self.fault(length, rows, at, before, self._earlier):
                out[at] += np.float32(1e-6)
        self._before[length] += 1
        self._earlier += 1
        return out
