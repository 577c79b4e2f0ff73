"""Reported non-leak: RSS of a memory-mapped dataset grows as its file pages are read.

Thread: https://github.com/huggingface/datasets/issues/4883 ("With dataloader RSS memory consumed
by HF datasets monotonically increase"). Iterating an Arrow-backed (memory-mapped) dataset made
the process's RSS climb steadily. After a long investigation the participants (following a
suggestion by rwightman, written up by stas00) concluded there is no leak, only a misleading
statistic: the dataset is memory-mapped, the kernel maps as much of the file into RAM as it has
room for and pages it out again when memory is short, and RSS counts those file-backed pages.

Reproduction (``pyarrow`` is not installed here; ``np.memmap`` maps the file the same way): a
float32 table of 4 KiB rows is written to a temporary file and mapped read-only; each step reads
the next 64 rows in order (256 KiB of file pages), reduces them to the model's input and trains.
The table holds 1.5 epochs of batches, so RSS rises by 256 KiB per step through the first epoch
and half of the second, then stays flat once every page is mapped (the loop wraps around). A
correct verdict is "mapped file pages", not a leak. Twin: ``fix_mmap_page_cache`` (a fresh map
per batch, so nothing stays mapped).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import torch

from .. import Scenario
from .._common import BATCH, CLASSES, IN_DIM, epochs_loop, plain_step, setup

SOURCE = "https://github.com/huggingface/datasets/issues/4883"
ROW = 4 * IN_DIM  # float32 values per row: one 4 KiB page
PASS_EPOCHS = 1.5  # the file holds this many epochs of batches

SCENARIO = Scenario(
    name="rep_mmap_page_cache",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="datasets#4883: RSS grows by mapped file pages of a memory-mapped dataset",
    expected_kind="mapped_file",
    source=SOURCE,
    reported=True,
)


def write_table(path: str, n_rows: int) -> None:
    """Write the table with plain file writes (so no page of it is mapped in this process)."""
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for start in range(0, n_rows, 1024):
            rows = min(1024, n_rows - start)
            f.write(rng.standard_normal((rows, ROW), dtype=np.float32).tobytes())


def batch_from(rows: np.ndarray, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(rows.reshape(len(rows), 4, IN_DIM).mean(axis=1))
    y = torch.arange(start, start + len(rows)) % CLASSES
    return x, y


def _run(mw: Any, epochs: int, steps_per_epoch: int, fresh_map_per_batch: bool
         ) -> list[list[Any]]:
    model, opt, _ = setup()
    n_rows = int(PASS_EPOCHS * steps_per_epoch) * BATCH
    with tempfile.TemporaryDirectory(prefix="memwatch-mmap-") as tmp:
        path = os.path.join(tmp, "table.f32")
        write_table(path, n_rows)
        # The dataset's table (``dataset_table``), mapped once for the whole run.
        maps: dict[str, np.memmap] = {}
        if not fresh_map_per_batch:
            maps["dataset_table"] = np.memmap(path, np.float32, "r", shape=(n_rows, ROW))
        cursor = [0]

        def read_rows(start: int) -> np.ndarray:
            if maps:
                return np.asarray(maps["dataset_table"][start:start + BATCH])  # stays mapped
            mm = np.memmap(path, np.float32, "r", shape=(n_rows, ROW))  # nanoGPT PR 428
            rows = np.array(mm[start:start + BATCH])  # a private copy; the map goes with mm
            del mm
            return rows

        def step(epoch: int, i: int) -> None:
            start = cursor[0]
            x, y = batch_from(read_rows(start), start)
            plain_step(model, opt, x, y)
            cursor[0] = (start + BATCH) % n_rows

        findings = epochs_loop(mw, epochs, steps_per_epoch, step)
        maps.clear()  # unmap before the directory goes
    return findings


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fresh_map_per_batch=False)
