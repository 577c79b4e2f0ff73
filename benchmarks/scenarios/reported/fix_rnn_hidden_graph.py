"""Fixed twin of ``rep_rnn_hidden_graph``: the recurrent state is detached after every step.

Thread: https://github.com/pytorch/pytorch/issues/2198 (detach the state periodically: truncated
backpropagation through time). Same policy, environments and learner; ``policy.hidden`` is
detached after each acting step, so each step's GRU graph is freed with the step. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_rnn_hidden_graph import SOURCE, _run

SCENARIO = Scenario(
    name="fix_rnn_hidden_graph",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="pytorch#2198 fixed: the RNN state is detached after every step",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_rnn_hidden_graph",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, detach=True)
