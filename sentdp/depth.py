"""Approximate Tukey depth of every candidate among a document's sentences: exact and fast.

For a direction v_j, sort the candidates' projections c_0 <= ... <= c_{m-1} once. A sentence
with projection x sits at ``pos = #{i : c_i <= x}``. The candidate of rank r then has
``h_j = #{sentences : x >= c_r} = #{s : pos_s > r}``, so its deviation
``|2 h_j - k| = |k - 2 #{s : pos_s <= r}|`` is a step function of r with at most k + 1 steps.
Building that step function per direction and reading it through each candidate's rank costs
O(k p log m + m p) per document instead of the O(m k p) of comparing everything with
everything. The utility is ``u = -max_j |2 h_j - k| / 2``.

Projections are float64 and computed by :func:`project` in fixed-size blocks of rows, so a
row's projection depends on that row alone (BLAS picks kernels by matrix shape: measured, a
row projected alone differs from the same row inside a larger matrix by ~3e-14). Sentences
and candidates go through the same routine, hence ties are resolved identically everywhere.

Two backends share the algorithm: NumPy on the CPU (the default) and torch for a CUDA
device. Each is exact with respect to its own projections; the two can differ on a sentence
whose projection lies within ~1e-13 of a candidate's.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sentdp.blas import one_blas_thread
from sentdp.errors import InputError

PROJECTION_BLOCK_ROWS = 64
"""Rows per matrix product in :func:`project`; every product has exactly this shape."""

MAX_SENTENCES = 16_000
"""Deviations are stored as int16, so k must stay below 2**15 / 2."""

DeviationArray = npt.NDArray[np.int16]
FloatArray = npt.NDArray[np.float64]


def project(x: npt.ArrayLike, directions: npt.ArrayLike) -> FloatArray:
    """Return ``x @ directions.T`` in float64, each row computed independently of the others.

    Rows are processed in zero-padded blocks of :data:`PROJECTION_BLOCK_ROWS` on one BLAS
    thread, so the BLAS call always has the same shape and split, and a row's bits do not
    depend on how many rows come with it.
    """
    xs = np.ascontiguousarray(x, dtype=np.float64)
    vt = np.ascontiguousarray(np.asarray(directions, dtype=np.float64).T)
    if xs.ndim != 2 or vt.ndim != 2 or xs.shape[1] != vt.shape[0]:
        raise InputError(
            f"cannot project arrays of shapes {xs.shape} onto directions of shape "
            f"{np.shape(directions)}: expected (n, d) and (p, d)"
        )
    n = xs.shape[0]
    out = np.empty((n, vt.shape[1]), dtype=np.float64)
    block = np.zeros((PROJECTION_BLOCK_ROWS, xs.shape[1]), dtype=np.float64)
    with one_blas_thread():
        for start in range(0, n, PROJECTION_BLOCK_ROWS):
            rows = xs[start : start + PROJECTION_BLOCK_ROWS]
            block[: len(rows)] = rows
            block[len(rows) :] = 0.0
            out[start : start + len(rows)] = (block @ vt)[: len(rows)]
    return out


def _level_values(k: int) -> npt.NDArray[np.int16]:
    """Deviation |k - 2t| of a candidate with t sentences strictly below it, t = 0..k."""
    return np.abs(k - 2 * np.arange(k + 1)).astype(np.int16)


def _check_documents(lengths: Sequence[int], ps: Sequence[int], p_max: int, rows: int) -> None:
    if sum(lengths) != rows:
        raise InputError(
            f"document lengths add up to {sum(lengths)} but {rows} sentences were given"
        )
    if len(lengths) != len(ps):
        raise InputError(f"got {len(lengths)} documents but {len(ps)} values of p")
    for k in lengths:
        if not 1 <= k <= MAX_SENTENCES:
            raise InputError(f"a document needs 1 to {MAX_SENTENCES} sentences, got {k}")
    for p in ps:
        if not 1 <= p <= p_max:
            raise InputError(f"p must be between 1 and {p_max} (directions in the bundle), got {p}")


class DepthIndex:
    """Candidates pre-sorted along every direction, for exact depth queries on the CPU."""

    def __init__(self, candidates: npt.ArrayLike, directions: npt.ArrayLike) -> None:
        self.directions = np.ascontiguousarray(directions, dtype=np.float64)
        projected = project(candidates, self.directions)  # (m, p)
        self.m, self.p_max = projected.shape
        if self.m == 0 or self.p_max == 0:
            raise InputError("need at least one candidate and one direction")
        order = np.argsort(projected, axis=0, kind="stable")
        self._sorted = np.ascontiguousarray(np.take_along_axis(projected, order, axis=0).T)
        ranks = np.empty((self.p_max, self.m), dtype=np.int64)
        ranks[np.arange(self.p_max)[:, None], order.T] = np.arange(self.m)
        # Index of (direction j, candidate i) in a flattened (p, m) table of per-rank values.
        self._flat_ranks = ranks + (np.arange(self.p_max) * self.m)[:, None]

    def deviations(
        self, sentences: FloatArray, lengths: Sequence[int], ps: Sequence[int]
    ) -> list[DeviationArray]:
        """Per document, ``max_j |2 h_j - k|`` over its first p directions, for every candidate.

        ``sentences`` holds the documents' sentence embeddings stacked row-wise, ``lengths`` the
        number of sentences of each document and ``ps`` how many directions each one uses.
        """
        _check_documents(lengths, ps, self.p_max, sentences.shape[0])
        p_used = max(ps)
        # Always project onto all directions: the product's shape must match the candidates'.
        values = np.ascontiguousarray(project(sentences, self.directions)[:, :p_used].T)
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        for start, stop in itertools.pairwise(offsets):
            values[:, start:stop].sort(axis=1)  # sorted queries also speed up searchsorted
        positions = np.empty(values.shape, dtype=np.int64)
        for j in range(p_used):
            positions[j] = self._sorted[j].searchsorted(values[j], side="right")
        out: list[DeviationArray] = []
        for k, p, start in zip(lengths, ps, offsets, strict=False):
            bounds = np.empty((p, k + 2), dtype=np.int64)
            bounds[:, 0] = 0
            bounds[:, -1] = self.m
            bounds[:, 1:-1] = positions[:p, start : start + k]
            table = np.repeat(np.tile(_level_values(k), p), np.diff(bounds, axis=1).ravel())
            out.append(np.take(table, self._flat_ranks[:p]).max(axis=0))
        return out


class TorchDepthIndex:
    """The same algorithm as :class:`DepthIndex` in torch, for a CUDA device."""

    def __init__(self, candidates: npt.ArrayLike, directions: npt.ArrayLike, device: Any) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)
        self.directions = np.ascontiguousarray(directions, dtype=np.float64)
        self._vt = torch.from_numpy(np.ascontiguousarray(self.directions.T)).to(self.device)
        projected = self.project(np.asarray(candidates, dtype=np.float64))
        self.m, self.p_max = projected.shape
        if self.m == 0 or self.p_max == 0:
            raise InputError("need at least one candidate and one direction")
        sorted_values, order = torch.sort(projected, dim=0, stable=True)
        self._sorted = sorted_values.T.contiguous()
        ranks = torch.empty((self.p_max, self.m), dtype=torch.int64, device=self.device)
        rows = torch.arange(self.p_max, device=self.device)[:, None]
        ranks[rows, order.T] = torch.arange(self.m, device=self.device)
        self._flat_ranks = ranks + rows * self.m

    def project(self, x: FloatArray) -> Any:
        """Blocked float64 projection on the device (see :func:`project`)."""
        torch = self._torch
        xs = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).to(self.device)
        if xs.ndim != 2 or xs.shape[1] != self._vt.shape[0]:
            raise InputError(f"cannot project an array of shape {tuple(xs.shape)}")
        out = torch.empty((xs.shape[0], self._vt.shape[1]), dtype=torch.float64, device=self.device)
        block = torch.zeros(
            (PROJECTION_BLOCK_ROWS, xs.shape[1]), dtype=torch.float64, device=self.device
        )
        for start in range(0, xs.shape[0], PROJECTION_BLOCK_ROWS):
            rows = xs[start : start + PROJECTION_BLOCK_ROWS]
            block.zero_()
            block[: len(rows)] = rows
            out[start : start + len(rows)] = (block @ self._vt)[: len(rows)]
        return out

    def deviations(
        self, sentences: FloatArray, lengths: Sequence[int], ps: Sequence[int]
    ) -> list[DeviationArray]:
        """As :meth:`DepthIndex.deviations`, computed on the index's device."""
        torch = self._torch
        _check_documents(lengths, ps, self.p_max, sentences.shape[0])
        p_used = max(ps)
        projections = self.project(sentences)[:, :p_used].T.contiguous()
        positions = torch.searchsorted(self._sorted[:p_used].contiguous(), projections, right=True)
        out: list[DeviationArray] = []
        start = 0
        for k, p in zip(lengths, ps, strict=True):
            bounds = torch.empty((p, k + 2), dtype=torch.int64, device=self.device)
            bounds[:, 0] = 0
            bounds[:, -1] = self.m
            bounds[:, 1:-1] = torch.sort(positions[:p, start : start + k], dim=1).values
            start += k
            levels = torch.from_numpy(_level_values(k)).to(self.device).repeat(p)
            table = torch.repeat_interleave(levels, torch.diff(bounds, dim=1).reshape(-1))
            worst = table[self._flat_ranks[:p]].amax(dim=0)
            out.append(worst.cpu().numpy().astype(np.int16, copy=False))
        return out
