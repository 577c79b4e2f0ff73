"""Twin of ``ho_rep_coco_dicts_cow``: the annotations are serialized into one shared numpy buffer.

Thread: https://github.com/tier4/autoware-ml/pull/78 (the fix: a fork-shared serialized buffer,
as detectron2's ``DatasetFromList(serialize=True)``). Same annotations, loader and loop; the
list of dicts is pickled into one ``uint8`` array with an offsets array, and each item is
unpickled from it on access: reading copies bytes out without writing to the shared pages, so
the workers' private memory stays flat. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .ho_rep_coco_dicts_cow import SOURCE, _run

SCENARIO = Scenario(
    name="ho_fix_coco_dicts_cow",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="workers",
    expected_culprit=None,
    description="autoware-ml#78 twin: annotations pickled into one shared numpy buffer",
    expected_kind="none",
    workers=True,
    source=SOURCE,
    split="heldout",
    twin_of="ho_rep_coco_dicts_cow",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, serialize=True)
