"""Twin of ``ho_rep_fqn_cache_snapshots``: parameter names resolved without a cache.

Thread: https://github.com/pytorch/pytorch/pull/149354 (removes ``functools.cache`` from
``_get_fqns`` so that a model is freed once its state dict was taken). Same training, per-epoch
snapshot, checkpoint and evaluation; each snapshot is freed when the loop drops it. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_fqn_cache_snapshots import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_fqn_cache_snapshots",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="pytorch#149354 twin: _get_fqns uncached, each epoch's snapshot freed",
    expected_kind="none",
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_fqn_cache_snapshots",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, cached=False)
