"""Twin of ``rep_numpy_view_bases``: each kept preview is a ``.copy()`` of its slice.

Thread: https://github.com/numpy/numpy/issues/15746 (the fix given: copy the slice, so the list
no longer keeps the whole array). Same loop; ``preview_clips`` holds 4 arrays of 64 samples a
step (about 1 KiB), and each batch's 64 KiB array is freed at the next step. A control: the
previews themselves are what the user meant to keep (0.5 MiB over the quick run).
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_numpy_view_bases import SOURCE, _run

SCENARIO = Scenario(
    name="fix_numpy_view_bases",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="numpy#15746 twin: previews copied out of their batch (1 KiB a step)",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_numpy_view_bases",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, copy=True)
