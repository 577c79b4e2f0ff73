"""Fixed twin of ``rep_gradcam_hooks``: the CAM is used in a ``with`` block, which frees its hooks.

Thread: https://github.com/jacobgil/pytorch-grad-cam/issues/132 (fixed by releasing the hooks
when the CAM is deleted or leaves its ``with`` block). Same model, loop and epoch-end
visualisation; the helper builds each CAM in a ``with`` block, so its hooks are removed before
training resumes and no training step stores anything. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_gradcam_hooks import SOURCE, _run

SCENARIO = Scenario(
    name="fix_gradcam_hooks",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="pytorch-grad-cam#132 fixed: each CAM releases its hooks (with block)",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_gradcam_hooks",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, use_with=True)
