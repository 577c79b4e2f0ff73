"""Fixed twin of ``rep_avgmeter_graph``: the trainer logs ``val.item()``, as the PR does.

Thread: https://github.com/visionml/pytracking/pull/313. Same trainer, meters, actor and loop;
``update_stats`` converts tensor statistics to Python floats before ``AverageMeter.update``, so
the meters hold floats and no graph outlives its step. ``history`` still gains one float per
statistic per epoch (a few bytes). A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_avgmeter_graph import SOURCE, _run

SCENARIO = Scenario(
    name="fix_avgmeter_graph",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="pytracking#313 fixed: statistics logged with .item(), meters hold floats",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_avgmeter_graph",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=True)
