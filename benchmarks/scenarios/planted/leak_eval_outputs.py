"""Leak in the evaluation loop: validation outputs kept with their graph, never cleared.

Validation runs every 30 training steps (``val_check_interval``) on 8 batches of 128 without
``torch.no_grad()`` and appends each batch's logits to ``val_outputs`` "to compute the epoch
metric": each kept logit tensor pins its whole forward graph (input and two activations, ~392 KiB
per validation batch, ~3 MiB per validation, ~105 KiB per training step on average).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import Data, epochs_loop, plain_step, setup

VAL_EVERY = 30
VAL_BATCHES = 8
VAL_BATCH = 128
# Per validation: 8 batches x (input + relu(fc1) + relu(fc2): 3 x 128 x 256 float32 + logits).
VAL_BYTES = VAL_BATCHES * (3 * VAL_BATCH * 256 * 4 + VAL_BATCH * 16 * 4)

SCENARIO = Scenario(
    name="leak_eval_outputs",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="val_outputs",
    description="validation without no_grad keeps its outputs (graph attached) in a global list",
    planted_bytes_per_step=VAL_BYTES / VAL_EVERY,
)

val_outputs: list[torch.Tensor] = []


def validate(model: nn.Module, val: Data) -> float:
    model.eval()
    correct = 0
    for _ in range(VAL_BATCHES):
        x, y = val.batch(VAL_BATCH)
        out = model(x)  # the bug, part 1: no torch.no_grad(), so the graph is built
        val_outputs.append(out)  # part 2: kept (with the graph) and never cleared
        correct += int((out.argmax(1) == y).sum())
    model.train()
    return correct / (VAL_BATCHES * len(y))


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    model, opt, data = setup()
    val = Data(seed=7)

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)
        if (i + 1) % VAL_EVERY == 0:
            validate(model, val)

    return epochs_loop(mw, epochs, steps_per_epoch, step)
