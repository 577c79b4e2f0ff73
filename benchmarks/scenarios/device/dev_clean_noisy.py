"""Device control: a clean run with noisy per-step footprints (variable sequence lengths).

Weights 6 GiB; the post-step footprint varies with sigma 64 MiB and activations are 2 GiB.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._device import GiB, MiB, run_scripted

SCENARIO = Scenario(
    name="dev_clean_noisy",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="device",
    expected_culprit=None,
    description="device: flat 6 GiB with Gaussian noise of 64 MiB per sample",
    expected_kind="none",
    device_total=16 * GiB,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return run_scripted(mw, epochs, steps_per_epoch, lambda s, e, i: 6 * GiB, 2 * GiB,
                        noise=64 * MiB, seed=4)
