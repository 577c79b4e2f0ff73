"""Twin of ``ho_rep_bounded_lru_tensors``: the scatter indices are computed per call, not cached.

Thread: https://github.com/pytorch/pytorch/pull/112301 (the cache, bounded at 128 entries, is
what holds the memory; the tests clear it). Same layer, masks and loop without the cache, so
nothing outlives the step. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_bounded_lru_tensors import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_bounded_lru_tensors",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="pytorch#112301 twin: scatter indices computed per call, no cache",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_bounded_lru_tensors",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, cached=False)
