"""Control: variable batch sizes (16 to 256 samples per step, drawn at random).

Bucketing by sequence length or a dynamic batch sampler: the per-step footprint jumps around by a
few MiB, but nothing is kept.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, plain_step, setup

SCENARIO = Scenario(
    name="ctrl_variable_batch",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="variable batch sizes (16-256): noisy footprint, nothing kept",
    expected_kind="none",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    g = torch.Generator().manual_seed(5)

    def step(epoch: int, i: int) -> None:
        size = int(torch.randint(16, 257, (1,), generator=g))
        x, y = data.batch(size)
        plain_step(model, opt, x, y)

    return epochs_loop(mw, epochs, steps_per_epoch, step)
