"""Control: copy-on-write saturation in DataLoader workers (pytorch#13246).

The dataset keeps its raw values in a big Python list of floats (~70 MiB of objects). Forked
workers share those pages with the parent until they touch them: reading an item updates its
reference count, which copies the page into the worker. Each worker's USS rises during the first
epoch while it touches its share of the pages (``shuffle=False``: a worker always reads the same
batches), then stays flat: private, but bounded by the dataset. Worker RSS barely moves.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from .. import Scenario
from .._common import CLASSES, IN_DIM, loader_epochs

SCENARIO = Scenario(
    name="ctrl_worker_cow",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="workers",
    expected_culprit=None,
    description="workers' copy-on-write of a Python-list dataset: USS rises in epoch 1, then flat",
    expected_kind="worker_cow",
    workers=True,
)

BATCH = 32
N_VALUES = 3_000_000  # Python floats: 24 B object + 8 B pointer each


class PythonListDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n_items: int) -> None:
        self.n = n_items
        self.values = [float(i % 1000) * 0.001 for i in range(N_VALUES)]
        self.span = N_VALUES // n_items

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.values[i * self.span:(i + 1) * self.span]  # touches span refcounts
        x = torch.tensor(window[:IN_DIM]) if len(window) >= IN_DIM else torch.zeros(IN_DIM)
        return x, torch.tensor(i % CLASSES)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    ds = PythonListDataset(steps_per_epoch * BATCH)
    return loader_epochs(mw, epochs, ds, BATCH, shuffle=False)
