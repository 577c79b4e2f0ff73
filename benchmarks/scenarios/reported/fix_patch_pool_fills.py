"""Twin of ``rep_patch_pool_fills``: a patch pool of 640 patches, full within the warm-up.

Thread: https://github.com/JDAI-CV/fast-reid/issues/673 (growth for the first epochs, then
stable; it goes away without ``RandomPatch``, whose pool is a bounded deque). Same training and
augmentation with ``pool_capacity`` 640: the pool is full after 10 steps and the run is flat
from then on. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_patch_pool_fills import SOURCE, _run

SCENARIO = Scenario(
    name="fix_patch_pool_fills",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="fast-reid#673 twin: RandomPatch pool of 640 patches, full within the warm-up",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_patch_pool_fills",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, pool_capacity=640)
