"""Recipes: how one mechanism variant (H, F, V, candidate classes) is made from public data.

* ``paper``: the paper's unsupervised recipe. k-means clusters of training documents, H
  trained so that recoded document means predict their cluster, F = recoded means of training
  documents with >= 8 sentences, p_max random directions, classes from C_dc.
* ``label-<d>d``: a task-tuned variant. H maps sentences to d dimensions and is trained at the
  sentence level with the public labels (:mod:`training.label_recoder`); F = recoded means of
  the same candidate documents, classes from the label head, random directions in d
  dimensions. Compact and label-specific.
* ``vote-<d>d``: as ``label``, but H is trained so that the majority of a document's sentences
  vote for its class (soft majority vote), and F holds the coordinate-wise medians of the
  candidate documents' recoded sentences.

Directions, H and candidates come from public data only, so the privacy proof is untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from rich.console import Console

from sentdp.bundle import Variant, VariantRecord
from sentdp.encoders import MLP
from training.candidates import candidate_embeddings, random_directions
from training.classifiers import softmax, train_classifier
from training.embeddings import CorpusEmbeddings
from training.label_recoder import Objective, train_label_recoder
from training.recoder import cluster_labels, recoded_means, train_recoder

RECIPES = ("paper", "label", "vote", "mixed")


LOW_DIMENSION_PS = (1, 2, 3, 5, 10, 20, 40)
"""p grid of the label-tuned variants: in a few dimensions a few directions can be best."""


@dataclass(frozen=True)
class VariantSpec:
    name: str
    recipe: str
    dim: int | None = None
    """Output dimension of H (None: the encoder's)."""

    def ps(self, paper_ps: Sequence[int]) -> tuple[int, ...]:
        """The values of p tried on validation for this variant."""
        return tuple(paper_ps) if self.recipe == "paper" else LOW_DIMENSION_PS


def default_label_dims(n_classes: int) -> tuple[int, ...]:
    """Output sizes of the label-tuned variants: a line suits two classes, a few dims more."""
    return (1, 2, 4) if n_classes == 2 else (2, 4, 8)


def specs_for(recipe: str, label_dims: Sequence[int]) -> list[VariantSpec]:
    """The variants a recipe trains; the p table later picks among them per epsilon."""
    paper = [VariantSpec("paper", "paper")]
    labelled = [VariantSpec(f"label-{d}d", "label", d) for d in label_dims]
    voting = [VariantSpec(f"vote-{d}d", "vote", d) for d in label_dims]
    by_recipe = {
        "paper": paper,
        "label": labelled,
        "vote": voting,
        "mixed": paper + labelled + voting,
    }
    if recipe not in by_recipe:
        raise ValueError(f"unknown recipe {recipe!r}: use one of {', '.join(RECIPES)}")
    return by_recipe[recipe]


@dataclass(frozen=True)
class TrainingData:
    embeddings: CorpusEmbeddings
    y: npt.NDArray[np.int64]
    train: list[int]
    validation: list[int]
    n_classes: int
    seed: int
    max_epochs: int
    n_clusters: int
    candidate_docs: list[int]
    """The public documents behind F (shared by every variant: their ids go in the manifest)."""
    p_max: int
    prototypes: tuple[int, ...] = ()
    """Per-class sizes of the prototype variants made of each variant (none: the paper's)."""


def build_variant(
    spec: VariantSpec, data: TrainingData, offset: int, console: Console
) -> tuple[Variant, dict[str, Any]]:
    """Train one variant; return it with its training scores."""
    if spec.recipe == "paper":
        return _paper(spec, data, offset, console)
    return _label(spec, data, offset, console)


def _assemble(
    spec: VariantSpec,
    data: TrainingData,
    offset: int,
    candidates: npt.NDArray[np.float64],
    class_probs: npt.NDArray[np.float64],
    recoder: MLP,
    labels_from: str,
    recoder_info: dict[str, Any],
    classifier_dc: MLP | None = None,
) -> Variant:
    """The variant's record, with its p_max random directions drawn from the recorded seed."""
    dim = candidates.shape[1]
    record = VariantRecord(
        name=spec.name,
        recipe=spec.recipe,
        dim=dim,
        candidates=candidates.shape[0],
        offset=offset,
        p_max=_useful_directions(dim, data.p_max),
        directions_seed=data.seed,
        labels_from=labels_from,
        recoder={"kind": "mlp", "layers": 4, **recoder_info},
    )
    return Variant(
        record=record,
        candidates=candidates,
        directions=random_directions(record.p_max, dim, data.seed),
        candidate_class_probs=class_probs,
        recoder=recoder,
        classifier_dc=classifier_dc,
    )


def _useful_directions(dim: int, p_max: int) -> int:
    return 1 if dim == 1 else p_max  # on a line every direction is +v or -v: one is enough


def _paper(
    spec: VariantSpec,
    data: TrainingData,
    offset: int,
    console: Console,
) -> tuple[Variant, dict[str, Any]]:
    emb, y = data.embeddings, data.y
    train_clusters, validation_clusters = cluster_labels(
        emb.means(data.train), emb.means(data.validation), data.n_clusters, data.seed
    )
    result = train_recoder(
        emb,
        data.train,
        data.validation,
        train_clusters,
        validation_clusters,
        output_dim=emb.vectors.shape[1],
        seed=data.seed,
        max_epochs=data.max_epochs,
    )
    console.print(
        f"variant {spec.name}: H best epoch {result.best_epoch}/{result.epochs}, validation "
        f"cluster accuracy {result.validation_accuracy:.3f}"
    )
    c_dc = train_classifier(
        recoded_means(result.recoder, emb, data.train),
        y[data.train],
        recoded_means(result.recoder, emb, data.validation),
        y[data.validation],
        data.n_classes,
        data.seed,
        data.max_epochs,
    )
    candidates = candidate_embeddings(result.recoder, emb, data.candidate_docs)
    variant = _assemble(
        spec,
        data,
        offset,
        candidates,
        softmax(c_dc.classifier(candidates)),
        result.recoder,
        "classifier",
        {
            "objective": "k-means clusters",
            "clusters": int(train_clusters.max()) + 1,
            "best_epoch": result.best_epoch,
        },
        classifier_dc=c_dc.classifier,
    )
    scores = {
        "recoded_nonprivate_macro_f1": c_dc.validation_macro_f1,
        "cluster_accuracy": result.validation_accuracy,
    }
    return variant, scores


def _label(
    spec: VariantSpec,
    data: TrainingData,
    offset: int,
    console: Console,
) -> tuple[Variant, dict[str, Any]]:
    assert spec.dim is not None
    voting = spec.recipe == "vote"
    result = train_label_recoder(
        data.embeddings,
        data.train,
        data.validation,
        data.y,
        spec.dim,
        data.n_classes,
        data.seed,
        objective=Objective("vote" if voting else "sentence"),
        max_epochs=min(data.max_epochs, 10),
    )
    console.print(
        f"variant {spec.name}: H best epoch {result.best_epoch}, validation loss "
        f"{result.validation_loss:.3f}"
    )
    candidates = candidate_embeddings(
        result.recoder, data.embeddings, data.candidate_docs, "median" if voting else "mean"
    )
    variant = _assemble(
        spec,
        data,
        offset,
        candidates,
        softmax(result.head(candidates)),
        result.recoder,
        "head",
        {
            "objective": "soft majority vote" if voting else "sentence-level labels",
            "candidates": f"{'median' if voting else 'mean'} of recoded sentences",
            "best_epoch": result.best_epoch,
        },
    )
    return variant, {"sentence_validation_loss": result.validation_loss}
