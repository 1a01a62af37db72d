"""Torch MLPs for training, exported to sentdp's exact float64 :class:`~sentdp.encoders.MLP`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn

from sentdp.encoders import MLP


def make_mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers of the given sizes with ReLU between them (the paper's MLP^o: 4 layers)."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def export_mlp(module: nn.Sequential) -> MLP:
    """The same function as float64 NumPy arrays (weights transposed to (in, out))."""
    linears = [layer for layer in module if isinstance(layer, nn.Linear)]
    return MLP(
        weights=tuple(layer.weight.detach().cpu().double().numpy().T.copy() for layer in linears),
        biases=tuple(layer.bias.detach().cpu().double().numpy().copy() for layer in linears),
    )


def seed_everything(seed: int, threads: int) -> None:
    """Deterministic torch: fixed seed, fixed thread count, deterministic algorithms."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def segment_means(rows: torch.Tensor, segments: torch.Tensor, count: int) -> torch.Tensor:
    """Mean of the rows of each segment; ``segments[i]`` names the segment of row i."""
    sums = torch.zeros((count, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    sums.index_add_(0, segments, rows)
    sizes = torch.bincount(segments, minlength=count).clamp(min=1).to(rows.dtype)
    return sums / sizes[:, None]
