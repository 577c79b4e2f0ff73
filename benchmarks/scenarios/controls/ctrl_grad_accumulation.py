"""Control: gradient accumulation over 4 micro-batches per optimizer step, done right.

``mw.step()`` is called once per optimizer step; losses are scaled and backpropagated one
micro-batch at a time (each graph freed by its backward), and the logged loss is a float.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .. import Scenario
from .._common import epochs_loop, setup

SCENARIO = Scenario(
    name="ctrl_grad_accumulation",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="gradient accumulation (4 micro-batches per optimizer step), losses as floats",
    expected_kind="none",
)

ACCUM = 4
losses: list[float] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(ACCUM):
            x, y = data.batch(32)
            loss = nn.functional.cross_entropy(model(x), y) / ACCUM
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)

    return epochs_loop(mw, epochs, steps_per_epoch, step)


