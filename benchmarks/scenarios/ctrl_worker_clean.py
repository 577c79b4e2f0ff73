"""Control: 2 persistent DataLoader workers with a tensor-backed dataset and nothing cached."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from . import Scenario
from ._common import CLASSES, IN_DIM, MLP

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
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    n = steps_per_epoch * BATCH
    ds = TensorDataset(torch.randn(n, IN_DIM), torch.randint(0, CLASSES, (n,)))
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                        persistent_workers=True)
    findings: list[list[Any]] = []
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            mw.step()
        findings.append(mw.end_epoch())
    return findings
