"""Smaller candidate sets for small epsilon: per-class k-means prototypes of a variant's F.

The exponential mechanism's utility gap grows with ln m, so at epsilon <= 3 a choice among
thousands of candidates is close to arbitrary. A prototype variant keeps its base variant's
H and directions and replaces F by k centres per class: the k-means centres of the base's
candidates of each public class (k = 1 is the class mean). A centre stands for the class whose
documents it summarises. (The base's own labeller is no substitute: in a label-tuned variant
the mean of a class's candidates often falls where the head predicts another class.)

Everything here is computed from the public training split, so a prototype variant is a
variant like any other: the same mechanism, the same proof, its own candidate ids and its own
sampler slack (smaller, because m is). The p table's validation choice decides per epsilon
whether a full set or prototypes serve.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from sklearn.cluster import KMeans

from sentdp.bundle import Variant, VariantRecord
from sentdp.errors import InputError

FloatArray = npt.NDArray[np.float64]

DEFAULT_PER_CLASS = (1, 4, 16)


def class_prototypes(
    points: FloatArray, classes: npt.NDArray[np.int64], per_class: int, seed: int
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """``per_class`` k-means centres of each class's points (fewer where a class has fewer
    points), classes in index order, with the class of each; k = 1 gives the class means."""
    centres, owners = [], []
    for c in np.unique(classes):
        rows = points[classes == c]
        k = min(per_class, len(rows))
        if k == 1:
            found = rows.mean(axis=0, keepdims=True)
        else:
            fitted = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(rows)
            found = fitted.cluster_centers_[np.lexsort(fitted.cluster_centers_.T[::-1])]
        centres.append(found)
        owners.append(np.full(len(found), c, dtype=np.int64))
    return np.concatenate(centres).astype(np.float64), np.concatenate(owners)


def prototype_name(base: str, per_class: int) -> str:
    return f"{base}-k{per_class}"


def prototype_variants(
    base: Variant,
    candidate_classes: npt.NDArray[np.int64],
    per_class: Sequence[int],
    offset: int,
    seed: int,
) -> list[Variant]:
    """One prototype variant of ``base`` per size in ``per_class`` that is smaller than the
    base's F; their candidate ids start at ``offset``, one after another."""
    if any(k < 1 for k in per_class):
        raise InputError(f"prototype sizes are counts per class, 1 or more: {list(per_class)}")
    variants = []
    n_classes = base.candidate_class_probs.shape[1]
    for k in sorted(set(per_class)):
        centres, owners = class_prototypes(base.candidates, candidate_classes, k, seed)
        if len(centres) >= base.record.candidates:
            continue
        record = VariantRecord(
            name=prototype_name(base.record.name, k),
            recipe="prototypes",
            dim=base.record.dim,
            candidates=len(centres),
            offset=offset,
            p_max=base.record.p_max,
            directions_seed=base.record.directions_seed,
            labels_from="class",
            recoder=base.record.recoder,
            recoder_from=base.record.name,
            prototypes={
                "of": base.record.name,
                "per_class": k,
                "kind": "class means" if k == 1 else "k-means centres per public class",
            },
        )
        variants.append(
            Variant(
                record=record,
                candidates=centres,
                directions=base.directions,
                candidate_class_probs=np.eye(n_classes)[owners],
                recoder=base.recoder,
            )
        )
        offset += len(centres)
    return variants
