"""Device control: epoch-scoped accumulation: +4 MiB per step during the epoch, freed at its end.

Predictions gathered on the device for an epoch metric, then released: every epoch climbs from
the same floor (5 GiB) by 4 MiB per step and starts again from it.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._device import GiB, MiB, run_scripted

SCENARIO = Scenario(
    name="dev_epoch_accumulation",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="device",
    expected_culprit=None,
    description="device: +4 MiB/step within each epoch, all released at the epoch end",
    expected_kind="accumulation",
    device_total=16 * GiB,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return run_scripted(mw, epochs, steps_per_epoch, lambda s, e, i: 5 * GiB + 4 * MiB * i,
                        2 * GiB, noise=2 * MiB, seed=7)
