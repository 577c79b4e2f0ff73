"""Device control: fragmentation, scripted: reserved grows by a 20 MiB segment every 8 steps while
allocated stays flat (reserved - allocated grows without bound until an allocation retry).

Not a leak of tensors: the remedy is the allocator configuration (``expandable_segments:True``),
not the training code.
"""

from __future__ import annotations

import random
from typing import Any

from .. import Scenario
from .._device import GiB, MiB

SCENARIO = Scenario(
    name="dev_fragmentation_scripted",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="device",
    expected_culprit=None,
    description="device: reserved +20 MiB every 8 steps, allocated flat (scripted counters)",
    expected_kind="fragmentation",
    device_total=16 * GiB,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    dev = mw.device
    rng = random.Random(8)
    step = 0
    findings: list[list[Any]] = []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            step += 1
            allocated = 5 * GiB + int(rng.gauss(0.0, 4 * MiB))
            reserved = 7 * GiB + (step // 8) * 20 * MiB
            dev.set(allocated=allocated + 2 * GiB, reserved=reserved)
            dev.set(allocated=allocated, reserved=reserved)
            mw.step()
        findings.append(mw.end_epoch())
    return findings
