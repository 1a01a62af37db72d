"""Document classifiers (4-layer MLPs with r outputs): C_dc on recoded means, C_nonpriv on G.

The number of epochs is chosen on validation: training runs up to ``max_epochs`` and keeps the
epoch with the best validation macro-F1 (ties: the earlier epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from sklearn.metrics import f1_score
from torch import nn

from sentdp.encoders import MLP
from training.fitting import Schedule, fit
from training.nets import export_mlp, make_mlp


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
    """C at the epoch of best validation macro-F1 (ties: the earlier epoch; no early stop)."""
    dim = train_x.shape[1]
    model = make_mlp([dim, dim, dim, dim, n_classes])
    x = torch.from_numpy(train_x).float()
    y = torch.from_numpy(train_y)
    vx = torch.from_numpy(validation_x).float()

    def batch_loss(batch: npt.NDArray[np.int64]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x[batch]), y[batch])

    def validation_macro_f1() -> float:
        return macro_f1(validation_y, model(vx).argmax(dim=1).numpy(), n_classes)

    fitted = fit(
        [model],
        batch_loss,
        validation_macro_f1,
        len(x),
        Schedule(max_epochs, batch_size, learning_rate),
        seed,
        higher_is_better=True,
    )
    return ClassifierResult(export_mlp(model), fitted.best_epoch, fitted.best_score)
