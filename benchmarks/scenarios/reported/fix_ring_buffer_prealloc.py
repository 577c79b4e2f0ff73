"""Twin of ``rep_ring_buffer_prealloc``: a ring buffer a tenth the size, resident in the warm-up.

Thread: https://github.com/MishaLaskin/curl/issues/10 (the memory grows because the replay
capacity is large; no leak). Same agent and loop with a capacity of 20 transitions: every page of
the buffer is written within the first 20 steps, and the run is flat from then on. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_ring_buffer_prealloc import CAPACITY, SOURCE, _run

SCENARIO = Scenario(
    name="fix_ring_buffer_prealloc",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="curl#10 twin: 20-transition ring buffer, resident within the warm-up",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_ring_buffer_prealloc",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, capacity=CAPACITY // 10)
