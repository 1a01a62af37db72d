"""A label-tuned recoder H for task bundles: every sentence pushed toward its document's class.

H (4-layer MLP d -> d_out, d_out small) and a linear head L (d_out -> r) are trained with
cross-entropy at the *sentence* level, each sentence carrying its document's label (public
training data only). A document's sentences then form a tight cloud near its class in a
low-dimensional space, where deep candidates of the right class are easy to find. A
candidate's class is L's argmax on it: post-processing of a public vector.
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
from training.nets import batches, export_mlp, make_mlp


@dataclass(frozen=True)
class LabelRecoderResult:
    recoder: MLP
    head: MLP
    best_epoch: int
    validation_loss: float


def _sentences(
    embeddings: CorpusEmbeddings, docs: Sequence[int], y: npt.NDArray[np.int64]
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = np.concatenate([embeddings.document(i) for i in docs])
    labels = np.concatenate([[y[i]] * len(embeddings.document(i)) for i in docs])
    return torch.from_numpy(rows).float(), torch.from_numpy(labels.astype(np.int64))


def train_label_recoder(
    embeddings: CorpusEmbeddings,
    train_docs: Sequence[int],
    validation_docs: Sequence[int],
    y: npt.NDArray[np.int64],
    output_dim: int,
    n_classes: int,
    seed: int,
    max_epochs: int = 10,
    patience: int = 3,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
) -> LabelRecoderResult:
    dim = embeddings.vectors.shape[1]
    recoder = make_mlp([dim, dim, dim, dim, output_dim])
    head = nn.Linear(output_dim, n_classes)
    optimizer = torch.optim.Adam([*recoder.parameters(), *head.parameters()], lr=learning_rate)
    x, labels = _sentences(embeddings, train_docs, y)
    vx, vlabels = _sentences(embeddings, validation_docs, y)
    rng = np.random.default_rng(seed)
    best = (float("inf"), 0, copy.deepcopy(recoder.state_dict()), copy.deepcopy(head.state_dict()))
    for epoch in range(1, max_epochs + 1):
        recoder.train()
        for batch in batches(len(x), batch_size, rng):
            loss = nn.functional.cross_entropy(head(recoder(x[batch])), labels[batch])
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        recoder.eval()
        with torch.no_grad():
            validation = float(nn.functional.cross_entropy(head(recoder(vx)), vlabels))
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
