"""Twin of ``rep_mmap_page_cache``: each batch is read through a fresh map that is then dropped.

Thread: https://github.com/huggingface/datasets/issues/4883 (RSS growth from mapped file pages,
not a leak). This is the same loop with that behaviour absent: every batch opens a new
``np.memmap``, copies its 64 rows out and drops the map (the workaround of nanoGPT PR 428,
https://github.com/karpathy/nanoGPT/pull/428, which cites the same effect), so no file page
stays mapped into the process and RSS stays flat. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_mmap_page_cache import SOURCE, _run

SCENARIO = Scenario(
    name="fix_mmap_page_cache",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="datasets#4883 twin: a fresh np.memmap per batch, dropped after the copy",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_mmap_page_cache",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fresh_map_per_batch=True)
