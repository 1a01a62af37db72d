"""The one training loop: Adam over shuffled mini-batches, the best validation epoch kept.

H (:mod:`training.recoder`), the label-tuned H (:mod:`training.label_recoder`) and the
classifiers (:mod:`training.classifiers`) differ only in their loss and their validation
score, so they share this loop: the same RNG use, the same update order and the same rules
for the best epoch (strictly better wins, so ties keep the earlier epoch) and for stopping
early (``patience`` epochs without a better score; ``None`` runs every epoch).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

BatchLoss = Callable[[npt.NDArray[np.int64]], torch.Tensor]
"""The training loss on a mini-batch, given the batch's positions in the training set."""


@dataclass(frozen=True)
class Schedule:
    """How long and how fast to train, and when to give up."""

    max_epochs: int
    batch_size: int
    learning_rate: float = 1e-3
    patience: int | None = None
    """Stop after this many epochs without a better validation score (None: never)."""


@dataclass(frozen=True)
class Fitted:
    epochs: int
    """Epochs run (fewer than ``max_epochs`` when training stopped early)."""
    best_epoch: int
    """1-based; 0 when no epoch beat the untrained state."""
    best_score: float
    """The validation score at ``best_epoch`` (±inf when no epoch beat the untrained state)."""


def batches(n: int, size: int, rng: np.random.Generator) -> list[npt.NDArray[np.int64]]:
    """One epoch: a fresh permutation of ``range(n)`` cut into batches of ``size``."""
    order = rng.permutation(n)
    return [order[i : i + size] for i in range(0, n, size)]


def fit(
    modules: Sequence[nn.Module],
    batch_loss: BatchLoss,
    validation_score: Callable[[], float],
    n_train: int,
    schedule: Schedule,
    seed: int,
    *,
    higher_is_better: bool,
) -> Fitted:
    """Train ``modules`` jointly; leave them in their state at the best validation epoch.

    ``validation_score`` runs after every epoch in eval mode without gradients. The batch
    order comes from ``numpy.random.default_rng(seed)`` alone, so runs are reproducible.
    """
    parameters = [p for module in modules for p in module.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=schedule.learning_rate)
    rng = np.random.default_rng(seed)
    best_score = -float("inf") if higher_is_better else float("inf")
    best_epoch = 0
    best_states = _states(modules)
    epoch = 0
    for epoch in range(1, schedule.max_epochs + 1):
        for module in modules:
            module.train()
        for batch in batches(n_train, schedule.batch_size, rng):
            loss = batch_loss(batch)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        for module in modules:
            module.eval()
        with torch.no_grad():
            score = validation_score()
        if score > best_score if higher_is_better else score < best_score:
            best_score, best_epoch, best_states = score, epoch, _states(modules)
        elif schedule.patience is not None and epoch - best_epoch >= schedule.patience:
            break
    for module, state in zip(modules, best_states, strict=True):
        module.load_state_dict(state)
    return Fitted(epochs=epoch, best_epoch=best_epoch, best_score=best_score)


def _states(modules: Sequence[nn.Module]) -> list[dict[str, torch.Tensor]]:
    return [copy.deepcopy(module.state_dict()) for module in modules]
