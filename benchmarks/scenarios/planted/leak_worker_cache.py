"""Leak inside DataLoader workers: each worker's dataset copy keeps every sample it produced.

The dataset "caches augmented samples" in ``self._seen``, keyed by a fresh random augmentation,
so nothing is ever reused. Workers are persistent (``persistent_workers=True``), so each worker's
list grows for the whole run: ~64 KiB per step split over 2 workers. The main process does not
grow at all: the leak is in ``workers.uss``, which the main process's census cannot see; the
workers' own censuses name ``_seen`` (issue 41).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from .. import Scenario
from .._common import IN_DIM, loader_epochs

BATCH = 32
FEATURES = 2 * IN_DIM  # 2 KiB per sample: 64 KiB per batch of 32

SCENARIO = Scenario(
    name="leak_worker_cache",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="workers",
    expected_culprit="_seen",  # named by the workers' own censuses (issue 41)
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
    ds = AugmentingDataset(steps_per_epoch * BATCH)
    return loader_epochs(mw, epochs, ds, BATCH, shuffle=True)
