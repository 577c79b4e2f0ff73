"""Control: a plain, correct training loop (``loss.item()`` for logging, nothing kept)."""

from __future__ import annotations

from typing import Any

from .. import Scenario
from .._common import epochs_loop, plain_step, setup

SCENARIO = Scenario(
    name="ctrl_clean",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="clean plain loop: losses logged with .item(), nothing kept",
    expected_kind="none",
)

losses: list[float] = []


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        losses.append(plain_step(model, opt, x, y).item())  # a float: 24 bytes, not a graph

    return epochs_loop(mw, epochs, steps_per_epoch, step)
