"""Twin of ``ho_rep_agent_id_dicts``: a finished agent's entries are deleted at its episode end.

Thread: https://github.com/Unity-Technologies/ml-agents/pull/3383 (the fix cleans up the
processor's dicts on reset boundaries "so that the dict doesn't grow"). Same environment,
processor and learner; when an agent's episode ends, its entries leave every per-agent dict, so
the dicts hold the 32 live agents only. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_agent_id_dicts import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_agent_id_dicts",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="ml-agents#3383 twin: finished agents' entries deleted from the processor",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_agent_id_dicts",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, delete_finished=True)
