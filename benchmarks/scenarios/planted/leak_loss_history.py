"""Leak: every step's loss is appended, with its autograd graph, to a module-global list.

The classic "I'll plot it later" bug: ``loss_history.append(loss)`` instead of ``loss.item()``,
here with ``backward(retain_graph=True)`` (added once to silence a "backward through the graph a
second time" error), so each kept loss pins its saved activations too (~200 KiB per step).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, plain_step, setup

SCENARIO = Scenario(
    name="leak_loss_history",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="loss_history",
    description="losses kept with their retained graph in a module-global list (not .item())",
    planted_bytes_per_step=3 * 64 * 256 * 4 + 64 * 16 * 4,  # input, two activations, log-softmax
)

loss_history: list[torch.Tensor] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        loss = plain_step(model, opt, x, y, retain_graph=True)
        loss_history.append(loss)  # the bug: keeps the graph and its saved activations

    return epochs_loop(mw, epochs, steps_per_epoch, step)
