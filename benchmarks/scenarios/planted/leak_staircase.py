"""Leak in steps: every 25 steps a rollback snapshot (weights and optimizer state) is kept.

Meant as a rolling set of "last good" snapshots to roll back to after a loss spike, but nothing
ever drops an old one: the model's ~0.52 MiB of parameters and as much of SGD momentum are copied
every 25 steps (a staircase of ~1 MiB stairs, ~42 KiB per step on average).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, plain_step, setup

EVERY = 25
PARAM_BYTES = (2 * 256 * 256 + 2 * 256 + 256 * 16 + 16) * 4
SCENARIO = Scenario(
    name="leak_staircase",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="snapshots",
    description="staircase: weights + momentum (1 MiB) appended to a global list every 25 steps",
    planted_bytes_per_step=2 * PARAM_BYTES / EVERY,
)

snapshots: list[dict[str, dict[str, torch.Tensor]]] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    counter = [0]

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)
        counter[0] += 1
        if counter[0] % EVERY == 0:
            # the bug: an unbounded list of full copies
            snapshots.append({
                "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "momentum": {name: opt.state[p]["momentum_buffer"].clone()
                             for name, p in model.named_parameters()},
            })

    return epochs_loop(mw, epochs, steps_per_epoch, step)
