"""Leak: a dict cache keyed by the global step, so nothing is ever a hit and nothing is evicted.

``embedding_cache[step] = hidden.detach()``: detached (no graph), but 64 KiB per step forever.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, hidden_step, setup

SCENARIO = Scenario(
    name="leak_unbounded_cache",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="embedding_cache",
    description="module-global dict cache keyed by step: never hit, never evicted (64 KiB/step)",
    planted_bytes_per_step=64 * 256 * 4,
)

embedding_cache: dict[int, torch.Tensor] = {}


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    counter = [0]

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        counter[0] += 1
        embedding_cache[counter[0]] = hidden.detach().clone()  # the bug: unbounded, key unique

    return epochs_loop(mw, epochs, steps_per_epoch, step)
