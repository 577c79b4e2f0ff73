"""Control: a one-time 24 MiB buffer allocated in the middle of the second epoch and kept.

A replay/prefetch buffer created lazily when first needed: one step change, then flat. Not a leak.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, plain_step, setup

SCENARIO = Scenario(
    name="ctrl_one_time_buffer",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="one 24 MiB buffer allocated once, mid epoch 2, and kept (a step change)",
    expected_kind="step_change",
)

BUFFER_BYTES = 24 << 20
buffers: dict[str, torch.Tensor] = {}


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)
        if epoch == 1 and i == steps_per_epoch // 2:
            buffers["replay"] = torch.ones(BUFFER_BYTES // 4)  # touched: resident at once

    return epochs_loop(mw, epochs, steps_per_epoch, step)
