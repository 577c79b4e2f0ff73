"""Twin of ``rep_eval_outputs_kept``: the evaluation loop releases its outputs when it ends.

Thread: https://github.com/Lightning-AI/pytorch-lightning/issues/5735 (fixed by PR 6326, which
deletes ``evaluation_loop.outputs`` at the validation epoch end). Same model, loop and
validations; the outputs are dropped as soon as the validation score is computed, so training
runs without them. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_eval_outputs_kept import SOURCE, _run

SCENARIO = Scenario(
    name="fix_eval_outputs_kept",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="lightning#5735 fixed: validation outputs released at the validation end",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_eval_outputs_kept",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, release=True)
