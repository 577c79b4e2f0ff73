"""Fixed twin of ``ho_rep_method_lru_cache``: the anchors are cached by a standalone function.

Thread: https://github.com/huggingface/transformers/issues/45412 (fixed by PR 45922: the lru
caches moved off the methods, so their keys hold no model). Same search, models and loop; the
anchors come from a module-level ``lru_cache`` keyed by the grid size and width: every trial hits
the same entry, and a dropped model is freed. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_method_lru_cache import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_method_lru_cache",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="transformers#45412 fixed: anchors cached without the model in the key",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_method_lru_cache",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=True)
