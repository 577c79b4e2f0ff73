"""Leak that starts in the second epoch: hard-example mining switched on after a warm-up epoch.

From epoch 1 (0-based) on, the worst samples of every batch are kept "for a later replay", with
their activations still attached to the graph (``hidden[worst]`` indexes a live tensor), ~48 KiB
per step, and the replay never happens. Epoch 0 is clean: a verdict in epoch 0 would be a guess.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import epochs_loop, setup

SCENARIO = Scenario(
    name="leak_from_epoch2",
    is_leak=True,
    leak_start_epoch=1,
    expected_metric="host",
    expected_culprit="hard_examples",
    description="leak starting in epoch 2: hard-example mining keeps inputs and activations",
    planted_bytes_per_step=2 * 24 * 256 * 4,  # 24 inputs and their activations
)

WARMUP_EPOCHS = 1
hard_examples: list[tuple[torch.Tensor, torch.Tensor]] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        opt.zero_grad(set_to_none=True)
        hidden = torch.relu(model.fc1(x))
        out = model.fc3(torch.relu(model.fc2(hidden)))
        per_sample = nn.functional.cross_entropy(out, y, reduction="none")
        per_sample.mean().backward()
        opt.step()
        if epoch >= WARMUP_EPOCHS:
            worst = per_sample.detach().topk(24).indices
            hard_examples.append((x[worst], hidden[worst]))  # the bug: kept forever

    return epochs_loop(mw, epochs, steps_per_epoch, step)
