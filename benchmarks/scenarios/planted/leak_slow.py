"""Leak: slow, 4 KiB per step: logged predictions are kept forever.

A logger buffers the logits of the last 4 steps (bounded) and, every 4th step, appends them
(``torch.cat``: 4 x 64 x 16 float32 = 16 KiB) to ``pred_log``, which nothing ever clears: 4 KiB
per step on average, about 2 MiB per 500-step epoch. The kind of leak that takes days to kill a
job. (Appending a 4 KiB tensor every step would show as ~20-60 KiB per step in RSS: small
64-byte-aligned blocks kept between each step's freed temporaries fragment glibc's heap.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import epochs_loop, setup

SCENARIO = Scenario(
    name="leak_slow",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="pred_log",
    description="slow leak: 16 KiB of logged logits every 4 steps kept in a global list",
    planted_bytes_per_step=4096,
    # Slow leaks matter in long epochs: 0.6 MiB per 150-step epoch disappears into the heap's
    # free holes (and under the census's own churn), so this one runs 2000-step epochs, in
    # --quick too (the loop is cheap): 8 MiB per epoch. (At 500 steps, 2 MiB per epoch, it was
    # found exactly at the deadline and missed it on a loaded machine.)
    epochs=3,
    steps_per_epoch=2000,
    quick_epochs=3,
    quick_steps=2000,
)

LOG_EVERY = 4
pred_log: list[torch.Tensor] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    buffer: list[torch.Tensor] = []

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        buffer.append(out.detach())
        if len(buffer) == LOG_EVERY:
            pred_log.append(torch.cat(buffer))  # the bug: 16 KiB every 4 steps, forever
            buffer.clear()

    return epochs_loop(mw, epochs, steps_per_epoch, step)
