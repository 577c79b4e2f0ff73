"""Leak: a ``functools.lru_cache`` keyed on the model and the global step, so every call is a new
entry and the cache keeps each call's result (issue 41: "a ``functools.lru_cache`` keyed on a
model, keeping each call's adapter tensors", whose culprit was a weight named by its shape).

``adapter_for(model, step)`` returns low-rank adapter matrices made from the model's first
layer (64 KiB a call, detached): the cache, not a list, is what holds them; its bound
(a million entries) is never reached, so it never evicts. The holder is the cache, named by
the function it wraps.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .. import Scenario
from .._common import epochs_loop, hidden_step, setup

SCENARIO = Scenario(
    name="leak_lru_cache",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="adapter_for",
    description="functools.lru_cache keyed on (model, step): every call a new entry, 64 KiB kept "
                "per step",
    planted_bytes_per_step=2 * 128 * 64 * 4,
)


@functools.lru_cache(maxsize=1_000_000)  # a bound no run of the corpus reaches
def adapter_for(model: torch.nn.Module, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The adapter for this model at this step (the bug: the step in the key)."""
    with torch.no_grad():
        w = next(model.parameters())
        a = torch.randn(128, 64) * w.std()
        b = torch.randn(128, 64) * w.std()
    return a, b


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    counter = [0]

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        hidden, out, loss = hidden_step(model, opt, x, y)
        counter[0] += 1
        adapter_for(model, counter[0])

    try:
        return epochs_loop(mw, epochs, steps_per_epoch, step)
    finally:
        adapter_for.cache_clear()
