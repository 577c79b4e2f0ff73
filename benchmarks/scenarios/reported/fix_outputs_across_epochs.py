"""Fixed twin of ``rep_outputs_across_epochs``: only each epoch's metrics are kept.

Thread: https://github.com/microsoft/InnerEye-DeepLearning/pull/209 (the fix: append
``epoch_results.metrics`` instead of the whole result). Same model and loop; the per-step outputs
still accumulate within an epoch (the epoch's result object holds them until the epoch ends), and
are freed when the next epoch's result replaces it. A control: accumulation within the epoch,
nothing carried across epochs.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_outputs_across_epochs import SOURCE, _run

SCENARIO = Scenario(
    name="fix_outputs_across_epochs",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="InnerEye#209 fixed: only each epoch's metrics appended; outputs freed per epoch",
    expected_kind="accumulation",
    source=SOURCE,
    twin_of="rep_outputs_across_epochs",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=True)
