"""A label-tuned recoder H for task bundles: every sentence pushed toward its document's class.

H (4-layer MLP d -> d_out, d_out small) and a linear head L (d_out -> r) are trained on public
training data with one of two objectives:

* ``sentence``: cross-entropy at the sentence level, each sentence carrying its document's
  label. A document's sentences form a cloud near its class in a low-dimensional space.
* ``vote``: a soft majority vote. Each sentence votes ``softmax(beta * L(H(s)))``; the
  document's mean vote, scaled by ``alpha``, must predict the label (cross-entropy), plus the
  sentence-level term with weight ``sentence_weight``. The mechanism's deepest candidate
  behaves like a median of the sentences, so training the *majority* of sentences to sit on
  the right side (rather than their mean) is what raises its accuracy; measured on
  movie-polarity validation: 0.78 -> 0.84 for the deepest candidate's accuracy ceiling.

A candidate's class is L's argmax on it: post-processing of a public vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from sentdp.encoders import MLP
from training.embeddings import CorpusEmbeddings
from training.fitting import Schedule, fit
from training.nets import export_mlp, make_mlp, segment_means


@dataclass(frozen=True)
class LabelRecoderResult:
    recoder: MLP
    head: MLP
    best_epoch: int
    validation_loss: float


@dataclass(frozen=True)
class Objective:
    """How H is trained: ``sentence`` cross-entropy, or the soft majority ``vote``."""

    kind: str = "sentence"
    beta: float = 1.0
    alpha: float = 5.0
    sentence_weight: float = 0.5


def _documents(
    embeddings: CorpusEmbeddings, docs: Sequence[int], y: npt.NDArray[np.int64]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = torch.from_numpy(np.concatenate([embeddings.document(i) for i in docs])).float()
    sizes = torch.tensor([len(embeddings.document(i)) for i in docs])
    segments = torch.repeat_interleave(torch.arange(len(docs)), sizes)
    return rows, segments, torch.from_numpy(y[list(docs)].astype(np.int64))


def _loss(
    objective: Objective,
    recoder: nn.Module,
    head: nn.Module,
    rows: torch.Tensor,
    segments: torch.Tensor,
    doc_labels: torch.Tensor,
) -> torch.Tensor:
    logits = head(recoder(rows))
    sentence = nn.functional.cross_entropy(logits, doc_labels[segments])
    if objective.kind == "sentence":
        return sentence
    votes = torch.softmax(objective.beta * logits, dim=1)
    mean_vote = segment_means(votes, segments, len(doc_labels))
    document = nn.functional.cross_entropy(objective.alpha * mean_vote, doc_labels)
    return document + objective.sentence_weight * sentence


def train_label_recoder(
    embeddings: CorpusEmbeddings,
    train_docs: Sequence[int],
    validation_docs: Sequence[int],
    y: npt.NDArray[np.int64],
    output_dim: int,
    n_classes: int,
    seed: int,
    objective: Objective | None = None,
    max_epochs: int = 10,
    patience: int = 3,
    documents_per_batch: int = 16,
    learning_rate: float = 1e-3,
) -> LabelRecoderResult:
    """H with its class head L, at the epoch of lowest validation loss."""
    objective = objective or Objective()
    if objective.kind not in {"sentence", "vote"}:
        raise ValueError(f"unknown objective {objective.kind!r}")
    dim = embeddings.vectors.shape[1]
    recoder = make_mlp([dim, dim, dim, dim, output_dim])
    head = nn.Linear(output_dim, n_classes)
    validation_batch = _documents(embeddings, validation_docs, y)

    def batch_loss(batch: npt.NDArray[np.int64]) -> torch.Tensor:
        rows, segments, labels = _documents(embeddings, [train_docs[i] for i in batch], y)
        return _loss(objective, recoder, head, rows, segments, labels)

    def validation_loss() -> float:
        return float(_loss(objective, recoder, head, *validation_batch))

    fitted = fit(
        [recoder, head],
        batch_loss,
        validation_loss,
        len(train_docs),
        Schedule(max_epochs, documents_per_batch, learning_rate, patience),
        seed,
        higher_is_better=False,
    )
    return LabelRecoderResult(
        recoder=export_mlp(recoder),
        head=export_mlp(nn.Sequential(head)),
        best_epoch=fitted.best_epoch,
        validation_loss=fitted.best_score,
    )
