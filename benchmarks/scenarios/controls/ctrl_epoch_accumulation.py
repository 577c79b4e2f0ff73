"""Control: epoch-scoped accumulation: outputs collected over the epoch, released at its end.

The usual "compute the epoch metric over all predictions" pattern, done right: copies of the
features of half of each batch (32 KiB per step) appended during the epoch, the metric computed
and the list cleared at the epoch end. Memory rises within each epoch and the peak scales with
epoch length, but nothing survives the epoch. (With 64 KiB per step, where glibc put each epoch's
9 MiB moved the level by up to 5 MiB from one epoch to the next: a noisier control.)
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, hidden_step, setup

SCENARIO = Scenario(
    name="ctrl_epoch_accumulation",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="epoch-scoped accumulation: per-step features kept until the epoch end, then freed",
    expected_kind="accumulation",
)

epoch_features: list[torch.Tensor] = []
epoch_metric: list[float] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        epoch_features.append(hidden[:32].detach().clone())

    def end(epoch: int) -> None:
        # A running reduction, not torch.cat: one 9 MiB temporary would be served by mmap once,
        # raise glibc's dynamic mmap threshold, and shift the heap for good (a one-time step, but
        # a confusing control).
        total = sum(float(f.sum()) for f in epoch_features)
        epoch_metric.append(total / sum(f.numel() for f in epoch_features))
        epoch_features.clear()  # released at the epoch end

    return epochs_loop(mw, epochs, steps_per_epoch, step, on_epoch_end=end)
