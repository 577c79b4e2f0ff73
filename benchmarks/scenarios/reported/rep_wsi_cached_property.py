"""Reported leak: each slide dataset caches its opened slide in a ``cached_property``, per worker.

Thread: https://github.com/kaiko-ai/eva/issues/387 ("Solve memory overflow issue with
``MultiWsiDataset``"; fixed by PR 388, "Replace ``cached_property`` in ``WsiDataset`` by LRU
cache"). Memory grew continuously while iterating through a ``MultiWsiDataset`` (a
``ConcatDataset`` of one ``WsiDataset`` per whole-slide image), "most likely due to the cached
properties which accumulate in memory": every ``WsiDataset`` kept its opened slide (``_wsi``) and
its patch coordinates as ``functools.cached_property`` values, so every slide a DataLoader worker
ever read stayed open in that worker. The merged fix moved both behind module-level LRU caches;
tested with 10k slides and 10 workers, "the memory doesn't build up anymore".

Reproduction: one pass over a ``MultiWsiDataset`` of many slides (8 patches each, read in order,
so a batch of 64 patches opens 8 new slides) through a DataLoader with 2 persistent workers,
checked every ``steps_per_epoch`` batches (a step-based run: the epochs here are check
intervals of one pass). Opening a slide reads its 16 KiB tile cache and header, which
``WsiDataset._wsi`` (a ``cached_property``) keeps in the worker's copy of the dataset: the
workers' memory grows by about 8 slides a step, the main process's not at all. The holder is the
``_wsi`` attribute of the workers' ``WsiDataset`` objects. Fixed twin: ``fix_wsi_cached_property``
(``_wsi`` resolved through a module-level ``lru_cache(maxsize=32)``, as in PR 388).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from .. import Scenario
from .._common import CLASSES, IN_DIM, MLP

SOURCE = "https://github.com/kaiko-ai/eva/issues/387"
BATCH = 64
PATCHES = 8  # per slide
TILE_CACHE = 16 * 1024  # bytes an opened slide keeps (decoded tiles, header)
WORKERS = 2

SCENARIO = Scenario(
    name="rep_wsi_cached_property",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="workers",
    expected_culprit="_wsi",
    description="eva#387: WsiDataset caches each opened slide (cached_property) in every worker",
    expected_kind="worker_growth",
    workers=True,
    # 8 slides opened per batch, each keeping its 16 KiB tile cache (and ~1 KiB of objects).
    planted_bytes_per_step=BATCH // PATCHES * (TILE_CACHE + 1024),
    source=SOURCE,
    reported=True,
)


class Slide:
    """An opened whole-slide image: header and a cache of decoded tiles."""

    def __init__(self, file_path: str) -> None:
        self.file_path = file_path
        seed = int(file_path.rsplit("_", 1)[1])
        self.tile_cache = np.random.default_rng(seed).integers(0, 256, TILE_CACHE, dtype=np.uint8)
        self.properties = {"mpp": 0.25, "width": 4096, "height": 4096, "vendor": "synthetic"}

    def read_region(self, x: int, y: int) -> torch.Tensor:
        start = (x * 31 + y * 17) % (TILE_CACHE - IN_DIM)
        return torch.from_numpy(self.tile_cache[start:start + IN_DIM].astype(np.float32) / 255.0)


@functools.lru_cache(maxsize=32)
def get_cached_wsi(file_path: str) -> Slide:
    """PR 388's fix: slides opened through one bounded cache per process."""
    return Slide(file_path)


class WsiDataset(Dataset[tuple[torch.Tensor, int]]):
    """Patches of one slide; the slide and its patch coordinates cached as in the report."""

    def __init__(self, file_path: str) -> None:
        self._file_path = file_path

    @functools.cached_property
    def _coords(self) -> np.ndarray:
        seed = int(self._file_path.rsplit("_", 1)[1])
        return np.random.default_rng(seed).integers(0, 4096, size=(PATCHES, 2))

    @functools.cached_property
    def _wsi(self) -> Slide:  # the reported version: kept for the dataset's lifetime
        return Slide(self._file_path)

    def __len__(self) -> int:
        return len(self._coords)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x, y = self._coords[index]
        return self._wsi.read_region(int(x), int(y)), int(x) % CLASSES


class LruWsiDataset(WsiDataset):
    @property
    def _wsi(self) -> Slide:  # type: ignore[override]
        return get_cached_wsi(self._file_path)


def _run(mw: Any, epochs: int, steps_per_epoch: int, lru: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    n_slides = epochs * steps_per_epoch * BATCH // PATCHES
    kind = LruWsiDataset if lru else WsiDataset
    # eva's MultiWsiDataset: a ConcatDataset of one dataset per slide (lengths read here, in the
    # main process, before the workers fork).
    dataset = ConcatDataset([kind(f"slide_{i}") for i in range(n_slides)])
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=False, num_workers=WORKERS,
                        persistent_workers=True)
    batches = iter(loader)
    findings: list[list[Any]] = []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            x, y = next(batches)
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            mw.step()
        findings.append(mw.end_epoch())
    return findings


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, lru=False)
