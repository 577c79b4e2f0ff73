"""Reported non-leak: the sampler builds a list of every index at the start of each epoch.

Thread: https://github.com/pytorch/pytorch/issues/50201 ("Excessive memory usage caused by
Samplers storing lists of indices"), with pytorch PRs 50202 and 103339. On datasets that report
a very large length (an audio corpus of 180 million frames in the report) ``RandomSampler`` and
``DistributedSampler`` materialise ``torch.randperm(n).tolist()``: a Python list of ``n`` ints
for every epoch, about 100 GB in the reporter's multi-GPU run. The thread locates the memory in
that per-epoch list, whose size is set by the dataset's length, and proposes samplers that
generate the permutation lazily (PR 103339: keep the permutation as a tensor and convert one
index at a time). The list is replaced at every epoch, not accumulated: a cost proportional to
the dataset, not a leak.

Reproduction: a frame dataset of 400,000 overlapping windows over a long signal, trained in
step-based epochs (150 batches of 64, a small slice of the dataset each epoch, as with
``limit_train_batches``) through ``DataLoader(shuffle=True)``. Each epoch's iterator holds its
sampler's 400,000-int list (about 15 MiB of list and int objects) while it runs; the next epoch
builds a new one and the old one is freed. Memory is flat from epoch to epoch. Twin:
``fix_sampler_index_list`` (a sampler that walks the permutation tensor without ``tolist()``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

from .. import Scenario
from .._common import BATCH, CLASSES, IN_DIM, MLP, epochs_loop

SOURCE = "https://github.com/pytorch/pytorch/issues/50201"
FRAMES = 400_000
HOP = 4

SCENARIO = Scenario(
    name="rep_sampler_index_list",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="pytorch#50201: RandomSampler's list of 400,000 indices rebuilt every epoch",
    expected_kind="none",
    source=SOURCE,
    reported=True,
)


class FrameDataset(Dataset[tuple[torch.Tensor, int]]):
    """Windows of IN_DIM samples every HOP samples over one long signal."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.signal = torch.randn(FRAMES * HOP + IN_DIM, generator=g)

    def __len__(self) -> int:
        return FRAMES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.signal[i * HOP:i * HOP + IN_DIM], i % CLASSES


class LazyRandomSampler(RandomSampler):
    """PR 103339's idea: iterate the permutation tensor, one Python int at a time."""

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(len(self.data_source), generator=self.generator)
        for i in range(len(perm)):
            yield int(perm[i])


def _run(mw: Any, epochs: int, steps_per_epoch: int, lazy: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = FrameDataset()
    g = torch.Generator().manual_seed(1)
    sampler = LazyRandomSampler(ds, generator=g) if lazy else RandomSampler(ds, generator=g)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler)
    state: dict[str, Any] = {}

    def step(epoch: int, i: int) -> None:
        if i == 0:
            state["it"] = iter(loader)  # a new epoch: the sampler draws a new permutation
        x, y = next(state["it"])
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def end_epoch(epoch: int) -> None:
        state.pop("it", None)  # the epoch's iterator (and its index list) is dropped

    return epochs_loop(mw, epochs, steps_per_epoch, step, on_epoch_end=end_epoch)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, lazy=False)
