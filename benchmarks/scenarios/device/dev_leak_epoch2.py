"""Device leak that starts in the second epoch: +3 MiB per step from epoch 1 (0-based) on.

Epoch 0 is flat (a warm-up epoch with a frozen backbone, say); then every step keeps 3 MiB.
Weights 4 GiB, activations 3 GiB on a 16 GiB device. The true OOM step depends on the epoch
length (the leak starts at its end), so it is computed for the full run's 200-step epochs; the
quick run uses the same epoch length for this scenario.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._device import GiB, MiB, first_step_at_or_above, run_scripted

BASE, ACT, RATE, TOTAL = 4 * GiB, 3 * GiB, 3 * MiB, 16 * GiB
STEPS = 200  # per epoch, full and quick runs alike (the OOM step depends on it)


def _floor(step: int, epoch: int = 0, i: int = 0) -> float:
    return BASE + RATE * max(0, step - STEPS)


SCENARIO = Scenario(
    name="dev_leak_epoch2",
    is_leak=True,
    leak_start_epoch=1,
    expected_metric="device",
    expected_culprit=None,
    description="device leak +3 MiB/step starting in epoch 2, flat before; OOM known",
    device_total=TOTAL,
    true_oom_step=first_step_at_or_above(TOTAL, lambda s: _floor(s) + ACT),
    steps_per_epoch=STEPS,
    quick_steps=STEPS,
    planted_bytes_per_step=RATE,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    if steps_per_epoch != STEPS:
        raise ValueError(f"dev_leak_epoch2 needs {STEPS} steps per epoch (its OOM step does)")
    return run_scripted(mw, epochs, steps_per_epoch, _floor, ACT, noise=1 * MiB, seed=3)
