"""Twin of ``rep_val_outputs_uncleared``: ``on_validation_epoch_end`` clears the list.

Thread: https://github.com/Lightning-AI/pytorch-lightning/pull/16520 (the migration guide's
``self.validation_step_outputs.clear()  # free memory``). Same module, loop and validations;
each validation's outputs are freed when it ends, so memory rises during a validation and falls
back. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_val_outputs_uncleared import SOURCE, VAL_EVERY, _run

SCENARIO = Scenario(
    name="fix_val_outputs_uncleared",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="lightning#16520 twin: validation_step_outputs cleared at each validation end",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_val_outputs_uncleared",
    eval_every=VAL_EVERY,
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, clear=True)
