"""Train the cluster-preserving recoder H (the paper's G' = H o G).

k-means (n_c clusters) on the training documents' mean G embeddings labels every document;
H (4-layer MLP d -> d_out) and a linear head L are trained jointly with Adam and cross-entropy
so that the mean of a document's H-recoded sentences predicts its cluster. Training stops
early when the validation loss has not improved for ``patience`` epochs; the best epoch wins.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from sklearn.cluster import KMeans
from torch import nn

from sentdp.encoders import MLP
from training.embeddings import CorpusEmbeddings
from training.fitting import Schedule, fit
from training.nets import export_mlp, make_mlp, segment_means


@dataclass(frozen=True)
class RecoderResult:
    recoder: MLP
    epochs: int
    best_epoch: int
    validation_loss: float
    validation_accuracy: float
    """How often L predicts the validation documents' k-means cluster."""


def cluster_labels(
    train_means: npt.NDArray[np.float64],
    validation_means: npt.NDArray[np.float64],
    n_clusters: int,
    seed: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """k-means clusters of the training documents, and the nearest cluster of validation ones."""
    n_clusters = min(n_clusters, len(train_means))
    kmeans = KMeans(n_clusters=n_clusters, random_state=seed, n_init=4).fit(train_means)
    return kmeans.labels_.astype(np.int64), kmeans.predict(validation_means).astype(np.int64)


def _document_batch(
    embeddings: CorpusEmbeddings, docs: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [embeddings.document(i) for i in docs]
    stacked = torch.from_numpy(np.concatenate(rows)).float()
    segments = torch.repeat_interleave(
        torch.arange(len(rows)), torch.tensor([len(r) for r in rows])
    )
    return stacked, segments


def _loss(
    recoder: nn.Module,
    head: nn.Module,
    embeddings: CorpusEmbeddings,
    docs: Sequence[int],
    targets: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, segments = _document_batch(embeddings, docs)
    logits = head(segment_means(recoder(rows), segments, len(docs)))
    return nn.functional.cross_entropy(logits, targets), logits


def train_recoder(
    embeddings: CorpusEmbeddings,
    train_docs: Sequence[int],
    validation_docs: Sequence[int],
    train_clusters: npt.NDArray[np.int64],
    validation_clusters: npt.NDArray[np.int64],
    output_dim: int,
    seed: int,
    max_epochs: int = 20,
    patience: int = 3,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
) -> RecoderResult:
    """H with its cluster head L, at the epoch of lowest validation loss."""
    dim = embeddings.vectors.shape[1]
    n_clusters = int(max(train_clusters.max(), validation_clusters.max())) + 1
    recoder = make_mlp([dim, dim, dim, dim, output_dim])
    head = nn.Linear(output_dim, n_clusters)
    train_targets = torch.from_numpy(train_clusters)
    validation_targets = torch.from_numpy(validation_clusters)
    accuracies = [0.0]  # validation cluster accuracy after each epoch (index 0: untrained)

    def batch_loss(batch: npt.NDArray[np.int64]) -> torch.Tensor:
        docs = [train_docs[i] for i in batch]
        return _loss(recoder, head, embeddings, docs, train_targets[batch])[0]

    def validation_loss() -> float:
        loss, logits = _loss(recoder, head, embeddings, list(validation_docs), validation_targets)
        accuracies.append(float((logits.argmax(dim=1) == validation_targets).float().mean()))
        return float(loss)

    schedule = Schedule(max_epochs, batch_size, learning_rate, patience)
    fitted = fit(
        [recoder, head],
        batch_loss,
        validation_loss,
        len(train_docs),
        schedule,
        seed,
        higher_is_better=False,
    )
    return RecoderResult(
        export_mlp(recoder),
        fitted.epochs,
        fitted.best_epoch,
        fitted.best_score,
        accuracies[fitted.best_epoch],
    )


def recoded_means(
    recoder: MLP | None, embeddings: CorpusEmbeddings, docs: Sequence[int]
) -> npt.NDArray[np.float64]:
    """g'(x): the mean of a document's H-recoded sentences, computed with the exact MLP."""
    if not docs:
        return np.zeros((0, recoder.output_dim if recoder else embeddings.vectors.shape[1]))
    rows = np.concatenate([embeddings.document(i) for i in docs])
    recoded = recoder(rows) if recoder is not None else rows.astype(np.float64)
    sizes = [embeddings.offsets[i + 1] - embeddings.offsets[i] for i in docs]
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    return np.stack([recoded[a:b].mean(axis=0) for a, b in itertools.pairwise(bounds)])
