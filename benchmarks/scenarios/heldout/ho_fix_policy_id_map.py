"""Twin of ``ho_rep_policy_id_map``: the (episode, agent) -> policy entry is deleted with the
agent's collector.

Thread: https://github.com/ray-project/ray/pull/15783 (the fix deletes the
``agent_key_to_policy_id`` entry when the episode is postprocessed). Same environments,
collector and learner; the map holds the live agent-episodes only. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_policy_id_map import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_policy_id_map",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="ray#15783 twin: agent_key_to_policy_id entry deleted at each episode end",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_policy_id_map",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, delete_mapping=True)
