"""Control: a bounded ``deque(maxlen=64)`` of recent outputs (with their graph) for smoothing.

Holds the last 64 steps' logits, graph attached: it fills during the first 64 steps, then every
append drops the oldest one. Bounded, so not a leak, even though it holds graphs.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import nn

from . import Scenario
from ._common import epochs_loop, setup

SCENARIO = Scenario(
    name="ctrl_bounded_deque",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="bounded deque(maxlen=64) of recent outputs and features",
    expected_kind="plateau",
)

recent: collections.deque[tuple[torch.Tensor, torch.Tensor]] = collections.deque(maxlen=64)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        opt.zero_grad(set_to_none=True)
        hidden = torch.relu(model.fc1(x))
        out = model.fc3(torch.relu(model.fc2(hidden)))
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        recent.append((out, hidden.detach()))  # bounded: the oldest falls out

    return epochs_loop(mw, epochs, steps_per_epoch, step)
