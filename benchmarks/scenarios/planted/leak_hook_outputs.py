"""Leak: a forward hook (registered once) appends every output of ``fc1``, graph attached.

A "feature extractor" hook left in place during training: ``captured.append(output)`` without
``.detach()``; each kept output pins its part of the graph (~64 KiB of activations per step and the
saved tensors behind it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import epochs_loop, plain_step, setup

SCENARIO = Scenario(
    name="leak_hook_outputs",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="captured",
    description="a forward hook appends every fc1 output (graph attached) to a module-global list",
    planted_bytes_per_step=64 * 256 * 4,  # one fc1 output
)

captured: list[torch.Tensor] = []


def _capture(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
    captured.append(output)  # the bug: no .detach(), never cleared


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    model.fc1.register_forward_hook(_capture)

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)

    return epochs_loop(mw, epochs, steps_per_epoch, step)
