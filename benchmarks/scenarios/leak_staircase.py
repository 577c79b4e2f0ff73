"""Leak in steps: every 25 steps a copy of the weights is appended to a list of "snapshots".

Meant as a rolling set of EMA/rollback snapshots, but nothing ever drops an old one: the model's
~0.52 MiB of parameters are copied every 25 steps (a staircase, ~21 KiB per step on average).
"""

from __future__ import annotations

from typing import Any

import torch

from . import Scenario
from ._common import epochs_loop, plain_step, setup

EVERY = 25
SCENARIO = Scenario(
    name="leak_staircase",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="snapshots",
    description="staircase: a copy of the weights appended to a global list every 25 steps",
    planted_bytes_per_step=(2 * 256 * 256 + 2 * 256 + 256 * 16 + 16) * 4 / EVERY,  # weights / 25
)

snapshots: list[dict[str, torch.Tensor]] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    counter = [0]

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)
        counter[0] += 1
        if counter[0] % EVERY == 0:
            # the bug: an unbounded list of full copies
            snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    return epochs_loop(mw, epochs, steps_per_epoch, step)
