"""Device leak, clean: +2 MiB per step on a 16 GiB device, with a known OOM step.

Weights and optimizer state 4 GiB, activations 3 GiB at the step's peak, 2 MiB more held after
every step. Out of memory when 4 GiB + 3 GiB + 2 MiB x step reaches 16 GiB: step 4608.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._device import GiB, MiB, first_step_at_or_above, run_scripted

BASE, ACT, RATE, TOTAL = 4 * GiB, 3 * GiB, 2 * MiB, 16 * GiB


def _floor(step: int, epoch: int = 0, i: int = 0) -> float:
    return BASE + RATE * step


SCENARIO = Scenario(
    name="dev_linear_leak",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="device",
    expected_culprit=None,
    description="device.allocated +2 MiB/step, little noise; true OOM step known",
    device_total=TOTAL,
    true_oom_step=first_step_at_or_above(TOTAL, lambda s: _floor(s) + ACT),
    planted_bytes_per_step=RATE,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return run_scripted(mw, epochs, steps_per_epoch, _floor, ACT, noise=0.5 * MiB)
