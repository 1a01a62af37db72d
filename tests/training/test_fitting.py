"""The shared training loop: best-epoch rules, early stopping, restored state, reproducibility."""

from __future__ import annotations

import copy

import numpy as np
import numpy.typing as npt
import pytest
import torch
from torch import nn

from training.fitting import Fitted, Schedule, batches, fit


def run(
    scores: list[float], patience: int | None, higher_is_better: bool, seed: int = 0
) -> tuple[Fitted, nn.Linear, list[dict[str, torch.Tensor]]]:
    """Fit a tiny model whose validation scores are ``scores``; keep its state per epoch."""
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    x = torch.arange(20, dtype=torch.float32).reshape(10, 2) / 10
    states: list[dict[str, torch.Tensor]] = []

    def batch_loss(batch: npt.NDArray[np.int64]) -> torch.Tensor:
        return (model(x[batch]) ** 2).mean()

    def validation_score() -> float:
        states.append(copy.deepcopy(model.state_dict()))
        return scores[len(states) - 1]

    schedule = Schedule(max_epochs=len(scores), batch_size=4, learning_rate=0.1, patience=patience)
    fitted = fit(
        [model], batch_loss, validation_score, 10, schedule, seed, higher_is_better=higher_is_better
    )
    return fitted, model, states


def test_the_model_is_left_in_its_state_at_the_best_epoch() -> None:
    fitted, model, states = run([0.5, 0.2, 0.4, 0.3], patience=None, higher_is_better=False)
    assert (fitted.epochs, fitted.best_epoch, fitted.best_score) == (4, 2, 0.2)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, states[1][name])


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_a_tie_keeps_the_earlier_epoch(higher_is_better: bool) -> None:
    fitted, _, _ = run([0.7, 0.7, 0.7], patience=None, higher_is_better=higher_is_better)
    assert (fitted.epochs, fitted.best_epoch) == (3, 1)


def test_training_stops_after_patience_epochs_without_improvement() -> None:
    fitted, _, states = run([0.9, 0.5, 0.6, 0.7, 0.1], patience=2, higher_is_better=False)
    assert (fitted.epochs, fitted.best_epoch, fitted.best_score) == (4, 2, 0.5)
    assert len(states) == 4


def test_without_patience_every_epoch_runs() -> None:
    fitted, _, _ = run([0.9, 0.5, 0.4, 0.3, 0.2], patience=None, higher_is_better=True)
    assert (fitted.epochs, fitted.best_epoch) == (5, 1)


def test_the_same_seed_gives_the_same_weights() -> None:
    _, first, _ = run([0.5, 0.4], patience=None, higher_is_better=False, seed=3)
    _, again, _ = run([0.5, 0.4], patience=None, higher_is_better=False, seed=3)
    assert torch.equal(first.weight, again.weight)
    assert torch.equal(first.bias, again.bias)


def test_batches_cover_every_position_once_per_epoch() -> None:
    cut = batches(10, 4, np.random.default_rng(0))
    assert [len(b) for b in cut] == [4, 4, 2]
    assert sorted(np.concatenate(cut).tolist()) == list(range(10))
