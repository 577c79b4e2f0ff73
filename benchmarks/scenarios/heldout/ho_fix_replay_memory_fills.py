"""Twin of ``ho_rep_replay_memory_fills``: a replay memory a tenth the size, full in the warm-up.

Thread: https://github.com/toshikwa/sac-discrete.pytorch/issues/28 (memory grows until the replay
memory holds its capacity; the knob is the memory size). Same agent, environment and loop with a
memory of 24 transitions: it is full after 24 steps, inside the first epoch, and the run is flat
from then on. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_replay_memory_fills import CAPACITY, SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_replay_memory_fills",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="sac-discrete#28 twin: replay memory of 24 transitions, full within the warm-up",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_replay_memory_fills",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, capacity=CAPACITY // 10)
