"""Document classifiers (4-layer MLPs with r outputs): C_dc on recoded means, C_nonpriv on G.

The number of epochs is chosen on validation: training runs up to ``max_epochs`` and keeps the
epoch with the best validation macro-F1 (ties: the earlier epoch).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from sklearn.metrics import f1_score
from torch import nn

from sentdp.encoders import MLP
from training.nets import batches, export_mlp, make_mlp


@dataclass(frozen=True)
class ClassifierResult:
    classifier: MLP
    best_epoch: int
    validation_macro_f1: float


def softmax(logits: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    result: npt.NDArray[np.float64] = e / e.sum(axis=1, keepdims=True)
    return result


def macro_f1(truth: npt.ArrayLike, predicted: npt.ArrayLike, n_classes: int) -> float:
    return float(
        f1_score(truth, predicted, average="macro", labels=list(range(n_classes)), zero_division=0)
    )


def train_classifier(
    train_x: npt.NDArray[np.float64],
    train_y: npt.NDArray[np.int64],
    validation_x: npt.NDArray[np.float64],
    validation_y: npt.NDArray[np.int64],
    n_classes: int,
    seed: int,
    max_epochs: int = 20,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
) -> ClassifierResult:
    dim = train_x.shape[1]
    model = make_mlp([dim, dim, dim, dim, n_classes])
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(train_x).float()
    y = torch.from_numpy(train_y)
    vx = torch.from_numpy(validation_x).float()
    best = (-1.0, 0, copy.deepcopy(model.state_dict()))
    for epoch in range(1, max_epochs + 1):
        model.train()
        for batch in batches(len(x), batch_size, rng):
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        model.eval()
        with torch.no_grad():
            predicted = model(vx).argmax(dim=1).numpy()
        score = macro_f1(validation_y, predicted, n_classes)
        if score > best[0]:
            best = (score, epoch, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[2])
    return ClassifierResult(export_mlp(model), best[1], best[0])
