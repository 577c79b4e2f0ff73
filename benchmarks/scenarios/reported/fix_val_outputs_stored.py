"""Twin of ``rep_val_outputs_stored``: ``validation_step`` returns nothing, so nothing is stored.

Thread: https://github.com/Lightning-AI/pytorch-lightning/issues/8583 (won't fix; the workaround
is not to return outputs the epoch end does not need). Same module, loop and validations; the
step logs its score and returns ``None``. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_val_outputs_stored import SOURCE, _run

SCENARIO = Scenario(
    name="fix_val_outputs_stored",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="lightning#8583 twin: validation_step returns nothing, nothing stored",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_val_outputs_stored",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, returns=False)
