"""Twin of ``rep_sampler_index_list``: the sampler walks the permutation tensor lazily.

Thread: https://github.com/pytorch/pytorch/issues/50201 (lists of indices sized by the dataset;
PR 103339 iterates the ``randperm`` tensor instead of materialising ``tolist()``). Same dataset,
loader and loop with a sampler that yields one index at a time from the tensor, so no
dataset-sized Python list exists. A control.
"""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .rep_sampler_index_list import SOURCE, _run

SCENARIO = Scenario(
    name="fix_sampler_index_list",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="pytorch#50201 twin: permutation walked as a tensor, no index list",
    expected_kind="none",
    source=SOURCE,
    twin_of="rep_sampler_index_list",
)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, lazy=True)
