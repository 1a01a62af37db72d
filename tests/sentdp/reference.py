"""Slow, obviously-correct reference implementations the fast code is checked against."""

from __future__ import annotations

import numpy as np

from sentdp.depth import project


def brute_force_utility(
    sentences: np.ndarray, candidates: np.ndarray, directions: np.ndarray, p: int | None = None
) -> np.ndarray:
    """All m*k*p comparisons of the definition u = -max_j |h_j - k/2|, ties counted as >=."""
    ps = project(sentences, directions)[:, :p]
    pf = project(candidates, directions)[:, :p]
    h = (ps[None, :, :] >= pf[:, None, :]).sum(axis=1)  # (m, p)
    return -np.abs(h - sentences.shape[0] / 2).max(axis=1)
