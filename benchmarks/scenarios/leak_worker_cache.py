"""Leak inside DataLoader workers: each worker's dataset copy keeps every sample it produced.

The dataset "caches augmented samples" in ``self._seen``, keyed by a fresh random augmentation,
so nothing is ever reused. Workers are persistent (``persistent_workers=True``), so each worker's
list grows for the whole run: ~64 KiB per step split over 2 workers. The main process does not
grow at all: the leak is in ``workers.uss``, and the main process's tensor census cannot see it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from . import Scenario
from ._common import IN_DIM, MLP

BATCH = 32
FEATURES = 2 * IN_DIM  # 2 KiB per sample: 64 KiB per batch of 32

SCENARIO = Scenario(
    name="leak_worker_cache",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="workers",
    expected_culprit=None,
    description="per-worker dataset cache that never hits (2 persistent DataLoader workers)",
    expected_kind="worker_growth",
    workers=True,
    planted_bytes_per_step=BATCH * FEATURES * 4,  # one batch of samples, in one worker
)


class AugmentingDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        self.n = n
        self._seen: dict[tuple[int, int], torch.Tensor] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        base = torch.randn(FEATURES, generator=g)
        aug = base + 0.1 * torch.randn(FEATURES)
        key = (i, int(torch.randint(0, 2**31 - 1, (1,))))
        self._seen[key] = aug  # the bug: keyed by a random draw, so never hit, never evicted
        return aug[:IN_DIM], torch.tensor(i % 16)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = AugmentingDataset(steps_per_epoch * BATCH)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                        persistent_workers=True)
    findings: list[list[Any]] = []
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            mw.step()
        findings.append(mw.end_epoch())
    return findings
