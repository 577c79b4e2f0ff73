"""Leak: a forward hook is registered inside the step and never removed.

Hooks pile up in ``model.fc2._forward_hooks``; each hook object keeps the first output it saw
(a "debug probe" meant to look at one activation), so memory grows by one output (64 KiB) per
step, and every forward pass gets slower as it calls all of them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import epochs_loop, plain_step, setup

SCENARIO = Scenario(
    name="leak_hook_per_step",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="_forward_hooks",
    description="a forward hook registered every step (handle dropped); each keeps one output",
    planted_bytes_per_step=64 * 256 * 4,  # one fc2 output per hook
)


class ActivationProbe:
    """Keeps the first output it sees (meant for a one-off look at the activations)."""

    def __init__(self) -> None:
        self.sample: torch.Tensor | None = None

    def __call__(self, module: nn.Module, inputs: tuple[torch.Tensor, ...],
                 output: torch.Tensor) -> None:
        if self.sample is None:
            self.sample = output.detach().clone()


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()

    def step(epoch: int, i: int) -> None:
        model.fc2.register_forward_hook(ActivationProbe())  # the bug: handle never removed
        x, y = data.batch()
        plain_step(model, opt, x, y)

    return epochs_loop(mw, epochs, steps_per_epoch, step)
