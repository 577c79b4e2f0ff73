"""Fixed twin of ``ho_rep_bpe_cache``: the word split is memoized by a bounded LRU cache.

Thread: https://github.com/EleutherAI/gpt-neox/pull/383 (the merged fix replaces the unbounded
``cache`` dict with an LRU cache). Same stream, tokenizer and model; the per-word split goes
through ``functools.lru_cache`` with a bound of 1024 words, so the cache fills in the first steps
and then only evicts. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_bpe_cache import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_bpe_cache",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="gpt-neox#383 fixed: BPE word splits in a bounded LRU cache",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_bpe_cache",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, bounded=True)
