"""The public candidate set F and the fixed directions V.

F holds up to m training documents with at least eight sentences, as means of G' = H o G.
V holds p_max unit vectors drawn from a recorded seed, independent of any data, so the
privacy proof holds for every document.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sentdp.encoders import MLP, recode
from sentdp.errors import InputError
from training.embeddings import CorpusEmbeddings
from training.recoder import recoded_means

MIN_CANDIDATE_SENTENCES = 8


def choose_candidates(
    embeddings: CorpusEmbeddings, train_docs: Sequence[int], m: int, seed: int
) -> list[int]:
    """Up to m training documents with >= 8 sentences, sampled with ``seed`` when more exist."""
    eligible = [
        i
        for i in train_docs
        if embeddings.offsets[i + 1] - embeddings.offsets[i] >= MIN_CANDIDATE_SENTENCES
    ]
    if not eligible:
        raise InputError(
            f"no training document has {MIN_CANDIDATE_SENTENCES} or more sentences, so there is "
            "no candidate for F; use a corpus of longer documents"
        )
    if len(eligible) <= m:
        return eligible
    rng = np.random.default_rng(seed)
    return sorted(eligible[i] for i in rng.choice(len(eligible), size=m, replace=False))


def candidate_embeddings(
    recoder: MLP | None,
    embeddings: CorpusEmbeddings,
    docs: Sequence[int],
    statistic: str = "mean",
) -> npt.NDArray[np.float64]:
    """One candidate per public document: the mean (the paper) or the coordinate-wise median of
    its recoded sentences (closer to what a depth-based mechanism finds)."""
    if statistic == "mean":
        return recoded_means(recoder, embeddings, docs)
    if statistic == "median":
        rows = [recode(recoder, embeddings.document(i)) for i in docs]
        return np.stack([np.median(r, axis=0) for r in rows])
    raise ValueError(f"unknown candidate statistic {statistic!r}")


def random_directions(p_max: int, dim: int, seed: int) -> npt.NDArray[np.float64]:
    """p_max directions uniform on the unit sphere, from ``seed`` alone."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((p_max, dim))
    result: npt.NDArray[np.float64] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return result
