"""Control: a periodic pattern: a per-step feature cache cleared every 40 steps.

Sawtooth: 64 KiB per step for 40 steps (2.5 MiB), then back to empty. Bounded by its period.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, hidden_step, setup

SCENARIO = Scenario(
    name="ctrl_periodic_cache",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="periodic memory pattern: a cache filled every step and cleared every 40 steps",
    expected_kind="none",
)

PERIOD = 40
window_cache: list[torch.Tensor] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    counter = [0]

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        window_cache.append(hidden.detach())
        counter[0] += 1
        if counter[0] % PERIOD == 0:
            window_cache.clear()

    return epochs_loop(mw, epochs, steps_per_epoch, step)
