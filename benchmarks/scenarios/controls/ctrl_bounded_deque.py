"""Control: a bounded ``deque(maxlen=32)`` of recent outputs (with their graph) for smoothing.

Holds the last 32 steps' logits, graph attached, and a copy of their hidden features (64 KiB): it
fills during the first 32 steps, then every append drops the oldest one. Bounded, so not a leak,
even though it holds graphs. (Keeping 64 KiB *views* of mid-step tensors in a 64-long deque made
glibc's heap creep for ~600 steps before it levelled off: a fragmentation effect, not the
container, and a muddier control.)
"""

from __future__ import annotations

import collections
from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, hidden_step, setup

SCENARIO = Scenario(
    name="ctrl_bounded_deque",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="bounded deque(maxlen=32) of recent outputs (graph attached) and features",
    expected_kind="plateau",
)

recent: collections.deque[tuple[torch.Tensor, torch.Tensor]] = collections.deque(maxlen=32)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        recent.append((out, hidden.detach().clone()))  # bounded: the oldest falls out

    return epochs_loop(mw, epochs, steps_per_epoch, step)
