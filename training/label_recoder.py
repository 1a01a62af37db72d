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

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from sentdp.encoders import MLP
from training.embeddings import CorpusEmbeddings
from training.nets import batches, export_mlp, make_mlp, segment_means


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
    objective = objective or Objective()
    if objective.kind not in {"sentence", "vote"}:
        raise ValueError(f"unknown objective {objective.kind!r}")
    dim = embeddings.vectors.shape[1]
    recoder = make_mlp([dim, dim, dim, dim, output_dim])
    head = nn.Linear(output_dim, n_classes)
    optimizer = torch.optim.Adam([*recoder.parameters(), *head.parameters()], lr=learning_rate)
    validation_batch = _documents(embeddings, validation_docs, y)
    rng = np.random.default_rng(seed)
    best = (float("inf"), 0, copy.deepcopy(recoder.state_dict()), copy.deepcopy(head.state_dict()))
    for epoch in range(1, max_epochs + 1):
        recoder.train()
        for batch in batches(len(train_docs), documents_per_batch, rng):
            rows, segments, labels = _documents(embeddings, [train_docs[i] for i in batch], y)
            loss = _loss(objective, recoder, head, rows, segments, labels)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        recoder.eval()
        with torch.no_grad():
            validation = float(_loss(objective, recoder, head, *validation_batch))
        if validation < best[0]:
            best = (
                validation,
                epoch,
                copy.deepcopy(recoder.state_dict()),
                copy.deepcopy(head.state_dict()),
            )
        elif epoch - best[1] >= patience:
            break
    recoder.load_state_dict(best[2])
    head.load_state_dict(best[3])
    return LabelRecoderResult(
        recoder=export_mlp(recoder),
        head=export_mlp(nn.Sequential(head)),
        best_epoch=best[1],
        validation_loss=best[0],
    )
