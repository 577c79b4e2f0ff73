"""Device control: one step change: 1 GiB allocated once in the middle of epoch 2 and kept."""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._device import GiB, MiB, run_scripted

SCENARIO = Scenario(
    name="dev_one_time_step",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="device",
    expected_culprit=None,
    description="device: a 1 GiB buffer allocated once mid epoch 2 and kept (a step change)",
    expected_kind="step_change",
    device_total=16 * GiB,
)


def _floor(step: int, epoch: int, i: int) -> float:
    late = epoch > 1 or (epoch == 1 and i >= 75)
    return 5 * GiB + (1 * GiB if late else 0)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return run_scripted(mw, epochs, steps_per_epoch, _floor, 2 * GiB, noise=4 * MiB, seed=6)
