"""Twin of ``rep_worker_cow_strings``: the metadata is one numpy array instead of a list of str.

Thread: https://github.com/pytorch/pytorch/issues/20433 (copy-on-access in workers, bounded, not a
leak; the thread's test shows a numpy array does not grow). Same dataset, loader and loop with
``metadata`` stored as a fixed-width bytes array: reading a record copies it out of the shared
buffer without writing to it, so the workers' pages stay shared and ``workers.uss`` stays flat.
A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_worker_cow_strings import SOURCE, _run

SCENARIO = Scenario(
    name="fix_worker_cow_strings",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="workers",
    expected_culprit=None,
    description="pytorch#20433 twin: metadata as a numpy bytes array, workers' pages stay shared",
    expected_kind="none",
    workers=True,
    source=SOURCE,
    twin_of="rep_worker_cow_strings",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, as_numpy=True)
