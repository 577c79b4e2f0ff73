"""Device leak under heavy noise: +1 MiB per step with Gaussian noise of sigma 8 MiB per sample.

Variable sequence lengths make the post-step footprint jump around by far more than the leak adds
per step (Stormlog's ">70% of calls growing" cannot fire: about half the steps go down).
Weights 6 GiB, activations 2 GiB; OOM on a 16 GiB device at step 8192.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._device import GiB, MiB, first_step_at_or_above, run_scripted

BASE, ACT, RATE, NOISE, TOTAL = 6 * GiB, 2 * GiB, 1 * MiB, 8 * MiB, 16 * GiB


def _floor(step: int, epoch: int = 0, i: int = 0) -> float:
    return BASE + RATE * step


SCENARIO = Scenario(
    name="dev_noisy_leak",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="device",
    expected_culprit=None,
    description="device.allocated +1 MiB/step under Gaussian noise of 8 MiB; true OOM known",
    device_total=TOTAL,
    true_oom_step=first_step_at_or_above(TOTAL, lambda s: _floor(s) + ACT),
    planted_bytes_per_step=RATE,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return run_scripted(mw, epochs, steps_per_epoch, _floor, ACT, noise=NOISE, seed=1)
