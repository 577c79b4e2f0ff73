"""Control: 2 persistent DataLoader workers with a tensor-backed dataset and nothing cached."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import TensorDataset

from .. import Scenario
from .._common import CLASSES, IN_DIM, loader_epochs

SCENARIO = Scenario(
    name="ctrl_worker_clean",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="workers",
    expected_culprit=None,
    description="2 persistent DataLoader workers over a TensorDataset, nothing cached",
    expected_kind="none",
    workers=True,
)

BATCH = 32


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    n = steps_per_epoch * BATCH
    ds = TensorDataset(torch.randn(n, IN_DIM), torch.randint(0, CLASSES, (n,)))
    return loader_epochs(mw, epochs, ds, BATCH, shuffle=True)
