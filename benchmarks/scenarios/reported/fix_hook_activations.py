"""Fixed twin of ``rep_hook_activations``: validation runs after ``model.eval()``.

Thread: https://github.com/meta-pytorch/opacus/issues/176. Same hooks and loop; the validation
batch runs with the model in eval mode (the reporter's fix), so the forward hooks store nothing
and every stored activation is popped by the next backward. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_hook_activations import SOURCE, _run

SCENARIO = Scenario(
    name="fix_hook_activations",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="opacus#176 fixed: model.eval() before no_grad validation, hooks store nothing",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_hook_activations",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=True)
