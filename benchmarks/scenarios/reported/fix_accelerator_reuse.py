"""Fixed twin of ``rep_accelerator_reuse``: ``accelerator.free_memory()`` before each trial.

Thread: https://github.com/huggingface/accelerate/issues/84 (fixed by
``Accelerator.free_memory()``, PR 89, called between trainings). Same search, accelerator and
loop; each new trial first empties the accelerator's internal lists, so the previous trial's
model and optimizer are freed. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_accelerator_reuse import SOURCE, _run

SCENARIO = Scenario(
    name="fix_accelerator_reuse",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="accelerate#84 fixed: accelerator.free_memory() before each trial",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_accelerator_reuse",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, frees=True)
