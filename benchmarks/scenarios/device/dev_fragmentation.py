"""Device control: fragmentation in the simulated caching allocator (``FakeDevice.malloc/free``).

Dynamic padding: every step allocates a temporary padded to the longest sequence seen so far
(10 MiB, growing by 2 MiB every 16 steps) plus a few 1-8 MiB activations, frees them, and keeps a
1-2.5 MiB metrics buffer for 100 steps. Each new, larger temporary needs a new segment (the cached
ones are all too small), so ``device.reserved`` keeps growing while ``device.allocated`` levels off
after the first 100 steps. The fix is ``expandable_segments:True``, not the training code.
"""

from __future__ import annotations

import random
from typing import Any

from .. import Scenario
from .._device import GiB, MiB

SCENARIO = Scenario(
    name="dev_fragmentation",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="device",
    expected_culprit=None,
    description="device fragmentation (simulated allocator): reserved grows, allocated levels off",
    expected_kind="fragmentation",
    device_total=16 * GiB,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    dev = mw.device
    rng = random.Random(9)
    weights = [dev.malloc(8 * MiB) for _ in range(50)]  # 400 MiB of parameters, kept
    kept: list[tuple[int, int]] = []  # (free at step, handle)
    step = 0
    findings: list[list[Any]] = []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            padded = dev.malloc(int((10 + 2 * (step // 16) + rng.uniform(0.0, 1.5)) * MiB))
            acts = [dev.malloc(int(rng.uniform(1.0, 8.0) * MiB)) for _ in range(3)]
            dev.free(padded)
            for h in acts:
                dev.free(h)
            kept.append((step + 100, dev.malloc(int(rng.uniform(1.1, 2.5) * MiB))))
            while kept and kept[0][0] <= step:
                dev.free(kept.pop(0)[1])
            step += 1
            mw.step()
        findings.append(mw.end_epoch())
    del weights
    return findings
