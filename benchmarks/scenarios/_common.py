"""Pieces the real training loops of the corpus share: a small MLP, synthetic data, one step.

Nothing in here holds tensors between calls, so whatever grows in a scenario is held by the
scenario module itself (that is what the analyzer must name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

# Two scenarios run side by side on a 2-core machine: one intra-op thread each keeps them from
# fighting over cores (and makes timings steadier).
torch.set_num_threads(1)

IN_DIM = 256
HIDDEN = 256
CLASSES = 16
BATCH = 64
N_SAMPLES = 4096


class MLP(nn.Module):
    """Three linear layers with named attributes, so holders read ``model.fc2._forward_hooks``."""

    def __init__(self, in_dim: int = IN_DIM, hidden: int = HIDDEN, classes: int = CLASSES):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class Data:
    """A fixed synthetic classification set; ``batch()`` gathers a fresh tensor every call."""

    def __init__(self, n: int = N_SAMPLES, in_dim: int = IN_DIM, classes: int = CLASSES,
                 seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, in_dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self._g = torch.Generator().manual_seed(seed + 1)

    def batch(self, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, len(self.x), (size,), generator=self._g)
        return self.x[idx], self.y[idx]


def pixel_features(obs: np.ndarray) -> torch.Tensor:
    """``IN_DIM`` values of each ``uint8`` observation of a batch, evenly spaced, scaled to
    [0, 1]: the MLP's input in the pixel-observation scenarios (a copy, nothing kept)."""
    flat = obs.reshape(len(obs), -1)
    stride = flat.shape[1] // IN_DIM
    return torch.from_numpy(flat[:, ::stride][:, :IN_DIM].astype(np.float32) / 255.0)


def setup(seed: int = 0, lr: float = 0.05) -> tuple[MLP, torch.optim.Optimizer, Data]:
    torch.manual_seed(seed)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return model, opt, Data(seed=seed)


def plain_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
    """One optimizer step; returns the loss (still attached to its graph).

    ``backward()`` frees the graph's saved activations unless ``retain_graph=True``; a kept loss
    then pins only the graph's nodes, a kept ``retain_graph`` loss pins every saved activation.
    """
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward(retain_graph=retain_graph)
    opt.step()
    return loss


def hidden_step(model: MLP, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step that also hands back the first hidden activation (``relu(fc1(x))``).

    Returns ``(hidden, out, loss)``, each still attached to its graph (whose saved activations
    ``backward()`` has freed): what the scenarios keep, clone or detach. Nothing here outlives
    the call, so whatever holds the tensors afterwards is the caller's.

    Callers bind all three (``hidden, out, loss = hidden_step(...)``), unused ones included:
    the tensors then live, and are freed, exactly as when each loop spelled the step out, which
    is how the corpus's RSS sizes were measured (see ``docs/detection-benchmark.md``: where small
    blocks land in the heap shows in RSS).
    """
    opt.zero_grad(set_to_none=True)
    hidden = torch.relu(model.fc1(x))
    out = model.fc3(torch.relu(model.fc2(hidden)))
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    return hidden, out, loss


def epochs_loop(mw: Any, epochs: int, steps_per_epoch: int,
                step_fn: Callable[[int, int], None],
                on_epoch_end: Callable[[int], None] | None = None) -> list[list[Any]]:
    """Run ``step_fn(epoch, i)`` then ``mw.step()`` per step, ``mw.end_epoch()`` per epoch."""
    findings: list[list[Any]] = []
    for epoch in range(epochs):
        for i in range(steps_per_epoch):
            step_fn(epoch, i)
            mw.step()
        if on_epoch_end is not None:
            on_epoch_end(epoch)
        findings.append(mw.end_epoch())
    return findings


def loader_epochs(mw: Any, epochs: int, dataset: Any, batch: int,
                  shuffle: bool) -> list[list[Any]]:
    """Train the MLP on ``dataset`` through a DataLoader with 2 persistent workers: one pass
    per epoch, ``mw.step()`` per batch, ``mw.end_epoch()`` per epoch (the worker scenarios)."""
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(dataset, batch_size=batch, shuffle=shuffle, num_workers=2,
                        persistent_workers=True)
    findings: list[list[Any]] = []
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            mw.step()
        findings.append(mw.end_epoch())
    return findings
