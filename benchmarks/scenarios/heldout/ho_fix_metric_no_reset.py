"""Fixed twin of ``ho_rep_metric_no_reset``: the threshold metrics are reset after each computation.

Thread: https://github.com/Lightning-AI/torchmetrics/issues/2921 (the maintainer's fix for
anomalib: call ``.reset()`` after ``.compute()`` when logging manually). Same training,
validation and post-processor; the metrics' lists are emptied at every validation end, so each
validation starts from nothing. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_metric_no_reset import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_metric_no_reset",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="torchmetrics#2921 fixed: threshold metrics reset after each validation",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_metric_no_reset",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, resets=True)
