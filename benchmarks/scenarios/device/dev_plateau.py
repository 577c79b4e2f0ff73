"""Device control: warm-up then plateau (caches and lazily built buffers fill, then stop).

Allocated rises from 4 GiB by 1.5 GiB along a saturating curve (time constant 40 steps), so it is
flat well before the end of the first epoch.
"""

from __future__ import annotations

import math
from typing import Any

from .. import Scenario
from .._device import GiB, MiB, run_scripted

SCENARIO = Scenario(
    name="dev_plateau",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="device",
    expected_culprit=None,
    description="device warm-up: +1.5 GiB along a saturating curve in epoch 1, then flat",
    expected_kind="plateau",
    device_total=16 * GiB,
)


def _floor(step: int, epoch: int, i: int) -> float:
    return 4 * GiB + 1.5 * GiB * (1.0 - math.exp(-step / 40.0))


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return run_scripted(mw, epochs, steps_per_epoch, _floor, 2 * GiB, noise=4 * MiB, seed=5)
