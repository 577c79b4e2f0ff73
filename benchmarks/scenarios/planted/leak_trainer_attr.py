"""Leak through an attribute: a trainer object keeps a per-step record in ``self.history``.

``self.history.append({"loss": loss, "logits": out})``: the loss and logits with their graph (the
graph's saved tensors are freed by backward, but the logits, the inputs referenced through the
record and the graph nodes stay), plus a detached copy of the hidden features for "analysis",
~70 KiB per step.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import Scenario
from .._common import MLP, Data, epochs_loop, hidden_step

SCENARIO = Scenario(
    name="leak_trainer_attr",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="history",
    description="a trainer object appends loss, logits and features to self.history every step",
    planted_bytes_per_step=64 * 256 * 4 + 64 * 16 * 4,  # features and logits
)


class Trainer:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = MLP()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.data = Data()
        self.history: list[dict[str, torch.Tensor]] = []

    def training_step(self, epoch: int, i: int) -> None:
        x, y = self.data.batch()
        hidden, out, loss = hidden_step(self.model, self.opt, x, y)
        # the bug: an ever-growing record with tensors in it
        self.history.append({"loss": loss, "logits": out, "features": hidden.detach()})


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    trainer = Trainer()
    return epochs_loop(mw, epochs, steps_per_epoch, trainer.training_step)
