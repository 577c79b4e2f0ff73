"""Twin of ``rep_wsi_cached_property``: opened slides go through a bounded LRU cache.

Thread: https://github.com/kaiko-ai/eva/issues/387 (fixed by PR 388, which replaced the
``cached_property`` by LRU caches). Same dataset, loader, workers and pass; ``WsiDataset._wsi``
is a plain property over a module-level ``functools.lru_cache(maxsize=32)``, so each worker keeps
at most 32 slides open. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_wsi_cached_property import SOURCE, _run

SCENARIO = Scenario(
    name="fix_wsi_cached_property",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="workers",
    expected_culprit=None,
    description="eva#387 twin: slides opened through lru_cache(maxsize=32) in each worker",
    expected_kind="none",
    workers=True,
    source=SOURCE,
    twin_of="rep_wsi_cached_property",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, lru=True)
