"""Twin of ``rep_epoch_end_outputs``: the module does not override ``training_epoch_end``.

Thread: https://github.com/Lightning-AI/pytorch-lightning/issues/15514 (working as intended:
outputs are kept for the epoch-end hook and freed after it). Same module, step and loop; without
the hook the loop keeps no step output, so memory stays flat within each epoch too. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_epoch_end_outputs import SOURCE, _run

SCENARIO = Scenario(
    name="fix_epoch_end_outputs",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="lightning#15514 twin: no training_epoch_end override, no outputs kept",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_epoch_end_outputs",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, override=False)
