"""Fixed twin of ``rep_memoize_cache``: ``SafeDataset`` without the memoization.

Thread: https://github.com/msamogh/nonechucks/issues/13 (the fix: remove ``@memoize``). Same
decoded dataset, wrapper, DataLoader and one-pass step-based loop; each sample is freed once its
batch has been used. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_memoize_cache import SOURCE, _run

SCENARIO = Scenario(
    name="fix_memoize_cache",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="nonechucks#13 fixed: SafeDataset without @memoize",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_memoize_cache",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=True)
