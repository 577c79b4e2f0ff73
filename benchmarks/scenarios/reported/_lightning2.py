"""A Lightning-2-style module and fit loop, reduced to what the step-output reproductions need.

Lightning 2.0 removed the ``training_epoch_end(outputs)`` / ``validation_epoch_end(outputs)``
hooks, which retained every step's output (pytorch-lightning PR 16520); its migration guide has
the module keep its own lists (``self.training_step_outputs``, ``self.validation_step_outputs``),
read them in ``on_train_epoch_end`` / ``on_validation_epoch_end``, and clear them there ("free
memory"). ``rep_train_outputs_uncleared`` and ``rep_val_outputs_uncleared`` omit one of those
clears. Nothing here imports Lightning: the loop calls the hooks in Lightning's order, with a
validation every ``val_every`` training steps (``val_check_interval``) and a training epoch end
before each ``mw.end_epoch()``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._common import Data, epochs_loop, hidden_step, setup

VAL_BATCH = 128


class LitClassifier:
    """The MLP as a LightningModule that follows the migration guide, clears optional."""

    def __init__(self, keep_train_outputs: bool, clear_train: bool, clear_val: bool) -> None:
        self.model, self.opt, self.data = setup()
        self.keep_train_outputs = keep_train_outputs
        self.clear_train = clear_train
        self.clear_val = clear_val
        self.training_step_outputs: list[dict[str, torch.Tensor]] = []
        self.validation_step_outputs: list[dict[str, torch.Tensor]] = []
        self.logged: dict[str, float] = {}

    def training_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        # Lightning runs backward and the optimizer step on the returned loss; the outputs
        # kept here are the step's, after backward() freed their graph's saved tensors.
        hidden, out, loss = hidden_step(self.model, self.opt, x, y)
        if self.keep_train_outputs:
            self.training_step_outputs.append({"loss": loss, "logits": out, "hidden": hidden})
        self.logged["train_loss"] = float(loss)

    def on_train_epoch_end(self) -> None:
        if self.training_step_outputs:
            self.logged["train_epoch_loss"] = float(
                torch.stack([o["loss"] for o in self.training_step_outputs]).mean())
        if self.clear_train:
            self.training_step_outputs.clear()  # free memory

    def validation_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        feats = torch.relu(self.model.fc1(x))
        preds = self.model.fc3(torch.relu(self.model.fc2(feats)))
        loss = nn.functional.cross_entropy(preds, y)
        self.validation_step_outputs.append({"loss": loss, "preds": preds, "feats": feats})

    def on_validation_epoch_end(self) -> None:
        self.logged["val_loss"] = float(
            torch.stack([o["loss"] for o in self.validation_step_outputs]).mean())
        if self.clear_val:
            self.validation_step_outputs.clear()  # free memory


def fit(mw: Any, module: LitClassifier, epochs: int, steps_per_epoch: int, val_every: int,
        val_batches: int) -> list[list[Any]]:
    """Train, validating every ``val_every`` steps (under ``no_grad``, in eval mode)."""
    val = Data(seed=7)

    def validate() -> None:
        module.model.eval()
        with torch.no_grad():
            for _ in range(val_batches):
                module.validation_step(*val.batch(VAL_BATCH))
        module.on_validation_epoch_end()
        module.model.train()

    def step(epoch: int, i: int) -> None:
        module.training_step(*module.data.batch())
        if (epoch * steps_per_epoch + i + 1) % val_every == 0:
            validate()

    return epochs_loop(mw, epochs, steps_per_epoch, step,
                       on_epoch_end=lambda epoch: module.on_train_epoch_end())
