"""Twin of ``ho_rep_shuffle_buffer``: a shuffle buffer of 256 samples, full after a few steps.

Thread: https://github.com/openvla/openvla/issues/4 (the buffer bounds the memory; a smaller
``shuffle_buffer_size`` where RAM is short). Same stream, model and loop with a 256-sample buffer:
it is full within the first few steps, so memory is flat for the whole run. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_shuffle_buffer import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_shuffle_buffer",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="openvla#4 twin: a 256-sample shuffle buffer, full within a few steps",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_shuffle_buffer",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, buffer_size=256)
