"""Reported non-leak: DataLoader workers copy the pages of a Python list of strings they read.

Thread: https://github.com/pytorch/pytorch/issues/20433 ("Dataloader's memory usage keeps
increasing during one single epoch"), which continues pytorch/pytorch#13246. Memory grew while
workers iterated a dataset holding its metadata as a Python list of strings. The thread traced it
to copy-on-access, not to anything being kept: forked workers share the parent's pages until they
touch them, and merely reading a Python object writes its reference count, so each page a worker
reads becomes a private copy. The growth is bounded by the data each worker reads (it stops once
every page it touches has been copied); a pure-Python test in the thread shows the same list
stored as a numpy array does not grow.

Reproduction: ``MetadataDataset.metadata`` is a list of 4096-character strings (the thread's
test uses ``str(i).zfill(1024)``; longer records put one string per page, so the copies show at
this scale), one per sample; ``__getitem__`` reads its string (and takes features from a tensor
table, which stays shared). Two persistent workers, ``shuffle=False``, so each worker reads the
same samples every epoch: ``workers.uss`` rises by about one page per sample during the first
epoch, then stays flat; ``workers.rss`` hardly moves. A correct verdict is copy-on-write, not a
leak. Twin: ``fix_worker_cow_strings`` (the metadata as a numpy array).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .. import Scenario
from .._common import CLASSES, IN_DIM, loader_epochs

SOURCE = "https://github.com/pytorch/pytorch/issues/20433"
BATCH = 64
STR_LEN = 4096

SCENARIO = Scenario(
    name="rep_worker_cow_strings",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="workers",
    expected_culprit=None,
    description="pytorch#20433: workers' copy-on-access of a list-of-str dataset, then flat",
    expected_kind="copy_on_write",
    workers=True,
    source=SOURCE,
    reported=True,
)


class MetadataDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, as_numpy: bool) -> None:
        strings = [str(i).zfill(STR_LEN) for i in range(n)]
        # The fix in the thread's test: the same data in one numpy buffer, no per-item objects.
        self.metadata: Any = np.array(strings, dtype=f"S{STR_LEN}") if as_numpy else strings
        self.table = torch.randn(1024, IN_DIM, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.metadata)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        record = self.metadata[i]  # reading a str object writes its refcount: page copied
        sample_id = int(record[-8:])
        return self.table[sample_id % 1024], torch.tensor(sample_id % CLASSES)


def _run(mw: Any, epochs: int, steps_per_epoch: int, as_numpy: bool) -> list[list[Any]]:
    ds = MetadataDataset(steps_per_epoch * BATCH, as_numpy)
    return loader_epochs(mw, epochs, ds, BATCH, shuffle=False)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, as_numpy=False)
