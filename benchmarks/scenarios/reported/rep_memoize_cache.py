"""Reported leak: a dataset wrapper that memoizes every sample it returns.

Thread: https://github.com/msamogh/nonechucks/issues/13 ("Memory leak"). Iterating a DataLoader
over ``nonechucks.SafeDataset`` made RAM grow for as long as the loop ran. A user found that
``SafeDataset``'s per-sample method was wrapped in ``@memoize``, which caches every returned
sample on the instance (the cache assumes the dataset fits in memory); removing the decorator
removed the leak, and the maintainer agreed (and proposed making the memoization optional); the
repository later dropped it (commit 130f502, "remove memoize").

Reproduction: ``SafeDataset`` wraps a dataset whose samples are decoded fresh on each access
(a new 1 KiB feature tensor and a label). Its ``__getitem__`` is memoized on the instance, as in
the version of the report, in a dict stored as ``_memoize__cache`` (the attribute name the
thread's ``memoize`` class ends up with). The
training loop is step-based over a dataset longer than the run (one pass, no index repeats, as
in the thread's 1,000,000-item example), so the cache gains 64 samples per step for the whole
run. Fixed twin: ``fix_memoize_cache`` (no memoization).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .. import Scenario
from .._common import BATCH, CLASSES, IN_DIM, epochs_loop, plain_step, setup

SOURCE = "https://github.com/msamogh/nonechucks/issues/13"

SCENARIO = Scenario(
    name="rep_memoize_cache",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="_memoize__cache",
    description="nonechucks#13: SafeDataset memoizes every sample it returns (one pass, no hits)",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): 64 samples per step, each a
    # 1 KiB tensor plus its tensor object, the result tuple and the cache entry.
    planted_bytes_per_step=BATCH * (IN_DIM * 4 + 400),
    source=SOURCE,
    reported=True,
)


def memoize(method: Callable[..., Any]) -> Callable[..., Any]:
    """Cache a method's results per instance, keyed by its arguments, never evicting."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any) -> Any:
        cache = self.__dict__.setdefault("_memoize__cache", {})
        key = (method.__name__, args)
        if key not in cache:
            cache[key] = method(self, *args)
        return cache[key]

    return wrapper


class DecodedDataset(Dataset[tuple[torch.Tensor, int]]):
    """Each access decodes a fresh sample (a new tensor), as an image or audio dataset would."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.table = torch.randn(4096, IN_DIM, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.table[i % 4096] * (1.0 + 1e-4 * (i // 4096)), i % CLASSES


class SafeDataset(Dataset[tuple[torch.Tensor, int]]):
    """Skips samples that fail to load (returns the next good one), as nonechucks does."""

    def __init__(self, dataset: DecodedDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def _safe_get_item(self, idx: int) -> tuple[torch.Tensor, int] | None:
        try:
            return self.dataset[idx]
        except Exception:
            return None

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        while idx < len(self):
            sample = self._safe_get_item(idx)
            if sample is not None:
                return sample
            idx += 1
        raise IndexError(idx)


class MemoizedSafeDataset(SafeDataset):
    """The version of the report: every sample the wrapper returns is kept on the instance."""

    @memoize
    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        return super().__getitem__(idx)


def _run(mw: Any, epochs: int, steps_per_epoch: int, fixed: bool) -> list[list[Any]]:
    model, opt, _ = setup()
    base = DecodedDataset(epochs * steps_per_epoch * BATCH)  # the run is one pass
    dataset = SafeDataset(base) if fixed else MemoizedSafeDataset(base)
    batches: Iterator[Any] = iter(DataLoader(dataset, batch_size=BATCH, shuffle=False))

    def step(epoch: int, i: int) -> None:
        x, y = next(batches)
        plain_step(model, opt, x, y)

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=False)
