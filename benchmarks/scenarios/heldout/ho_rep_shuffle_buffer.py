"""Reported non-leak: a streaming dataset's shuffle buffer fills, then memory stops growing.

Thread: https://github.com/openvla/openvla/issues/4 ("memory leak"). Host memory kept growing
while training on an iterable (RLDS) dataset. The maintainers pointed at the dataset's shuffle
buffer (``shuffle_buffer_size``, 256,000 samples by default), which is filled as samples stream
in, and advised a smaller buffer where RAM is short; the reporter confirmed that memory "finally
... stop[s] increasing" once the buffers are full (870 GB across 8 processes in his run). Bounded
by the buffer size: not a leak.

Reproduction: an ``IterableDataset`` streams decoded observations (a 1 KiB float tensor and a
label per sample) through a shuffle buffer that, like webdataset's or tf.data's, grows by one
sample for every sample it yields until it holds ``BUFFER`` samples, then replaces a random
sample per yield. The main process loads (no workers), so ``host.rss`` rises by about 64 samples
per step until the buffer is full, a little past the first epoch, and is flat from then on. A
correct verdict is a plateau (bounded), not a leak. Twin: ``ho_fix_shuffle_buffer`` (a buffer of 256
samples, as the thread advises when memory is short).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from .. import Scenario
from .._common import BATCH, CLASSES, IN_DIM, MLP, epochs_loop

SOURCE = "https://github.com/openvla/openvla/issues/4"
BUFFER = 12_000

SCENARIO = Scenario(
    name="ho_rep_shuffle_buffer",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="openvla#4: streaming shuffle buffer fills (12,000 samples), then flat",
    expected_kind="bounded",
    source=SOURCE,
    split="heldout",
    reported=True,
)


class EpisodeStream(IterableDataset[tuple[torch.Tensor, int]]):
    """Endless decoded observations, shuffled through a buffer that grows until full."""

    def __init__(self, buffer_size: int) -> None:
        self.buffer_size = buffer_size
        self.table = torch.randn(4096, IN_DIM, generator=torch.Generator().manual_seed(0))

    def _decode(self) -> Iterator[tuple[torch.Tensor, int]]:
        for i in itertools.count():
            yield self.table[i % 4096] * (1.0 + 1e-4 * (i // 4096)), i % CLASSES

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        rng = random.Random(0)
        source = self._decode()
        buf: list[tuple[torch.Tensor, int]] = []
        for sample in source:
            buf.append(sample)
            if len(buf) < self.buffer_size:
                buf.append(next(source))  # grow by one sample per yield until full
            k = rng.randrange(len(buf))
            buf[k], buf[-1] = buf[-1], buf[k]
            yield buf.pop()


def _run(mw: Any, epochs: int, steps_per_epoch: int, buffer_size: int) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = iter(DataLoader(EpisodeStream(buffer_size), batch_size=BATCH))

    def step(epoch: int, i: int) -> None:
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return epochs_loop(mw, epochs, steps_per_epoch, step)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, buffer_size=BUFFER)
