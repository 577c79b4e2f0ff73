"""Device staircase leak: 64 MiB more held every 32 steps (a buffer appended per "checkpoint").

Flat between the stairs, so most consecutive samples do not grow. Weights 5 GiB, activations
2 GiB on a 16 GiB device: OOM at the stair where the peak first reaches 16 GiB.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._device import GiB, MiB, first_step_at_or_above, run_scripted

BASE, ACT, STAIR, EVERY, TOTAL = 5 * GiB, 2 * GiB, 64 * MiB, 32, 16 * GiB


def _floor(step: int, epoch: int = 0, i: int = 0) -> float:
    return BASE + STAIR * (step // EVERY)


SCENARIO = Scenario(
    name="dev_staircase_leak",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="device",
    expected_culprit=None,
    description="device staircase: +64 MiB every 32 steps (2 MiB/step on average); OOM known",
    device_total=TOTAL,
    true_oom_step=first_step_at_or_above(TOTAL, lambda s: _floor(s) + ACT),
    planted_bytes_per_step=STAIR / EVERY,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return run_scripted(mw, epochs, steps_per_epoch, _floor, ACT, noise=2 * MiB, seed=2)
