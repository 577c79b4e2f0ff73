"""Leak: caught exceptions are kept in a list; their tracebacks keep ``train_step``'s frame alive.

A sanity check raises on some condition every step; the loop "logs" the exception object for a
later report. ``e.__traceback__`` references the frame of ``train_step``, whose locals include
the batch, the activations and the loss with its graph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import epochs_loop, setup

SCENARIO = Scenario(
    name="leak_stored_exceptions",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="traceback",
    description="stored exception objects: their tracebacks keep train_step frames (and tensors)",
    planted_bytes_per_step=2 * 64 * 256 * 4 + 64 * 16 * 4,  # x, hidden, out in the frame
)

failures: list[BaseException] = []


class LossSpike(Exception):
    pass


def _check(loss: torch.Tensor, threshold: float) -> None:
    if loss.item() > threshold:
        raise LossSpike(f"loss {loss.item():.3f} above {threshold}")


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    hidden = torch.relu(model.fc1(x))
    out = model.fc3(torch.relu(model.fc2(hidden)))
    loss = nn.functional.cross_entropy(out, y)
    try:
        _check(loss, threshold=0.0)  # always "spikes": the point is what the exception keeps
    except LossSpike as e:
        failures.append(e)  # the bug: e.__traceback__ -> this frame -> hidden, out, loss (graph)
    loss.backward()
    opt.step()


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        train_step(model, opt, x, y)

    return epochs_loop(mw, epochs, steps_per_epoch, step)
