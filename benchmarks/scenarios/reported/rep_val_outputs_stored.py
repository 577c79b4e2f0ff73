"""Reported non-leak: validation outputs stored for an epoch-end hook that nobody overrides.

Thread: https://github.com/Lightning-AI/pytorch-lightning/issues/8583 ("validation_step output
shouldn't be stored if validation_epoch_end isn't overriden", split from #8453 "evaluation_loop
memory leak"). In Lightning 1.4 whatever ``validation_step`` returned was kept for the whole
validation epoch, even when no ``validation_epoch_end`` would read it; the reporter called it a
memory leak. It was closed as *won't fix*: the outputs live until the validation epoch ends and
are then freed (Lightning 2.0 later removed the mechanism, PR 16520), so memory rises during a
validation and falls back: accumulation, not a leak.

Reproduction: a minimal Lightning-1.4-style fit loop with a validation at every epoch end (a
quarter as many batches as training steps) whose ``validation_step`` returns its predictions and
features (128 KiB); the loop appends every output to ``epoch_outputs`` and drops the list when
the validation ends, before training resumes, with no ``validation_epoch_end`` overridden.
Nothing survives into the next training epoch. Twin: ``fix_val_outputs_stored``
(``validation_step`` returns nothing, the thread's workaround).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, epochs_loop, plain_step, setup

SOURCE = "https://github.com/Lightning-AI/pytorch-lightning/issues/8583"
VAL_FRACTION = 4

SCENARIO = Scenario(
    name="rep_val_outputs_stored",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="lightning#8583: validation outputs stored through each validation, then freed",
    expected_kind="accumulation",
    source=SOURCE,
    reported=True,
)


class LitModule:
    def __init__(self, returns_outputs: bool) -> None:
        self.model, self.optimizer, self.data = setup()
        self.returns_outputs = returns_outputs
        self.val_scores: list[float] = []

    def validation_step(self, x: torch.Tensor) -> dict[str, torch.Tensor] | None:
        model: Any = self.model
        feats = torch.relu(model.fc1(x))
        preds = model(x)
        self.val_scores.append(float(preds.mean()))
        return {"preds": preds, "feats": feats, "x": x.clone()} if self.returns_outputs else None


class ValidationLoop:
    """Lightning 1.4: keep every returned output until the validation epoch ends."""

    def __init__(self) -> None:
        self.epoch_outputs: list[dict[str, torch.Tensor]] = []

    def run(self, module: LitModule, batches: int) -> None:
        model: nn.Module = module.model
        model.eval()
        with torch.no_grad():
            for _ in range(batches):
                out = module.validation_step(module.data.batch(BATCH)[0])
                if out is not None:
                    self.epoch_outputs.append(out)
        model.train()
        self.epoch_outputs = []  # no validation_epoch_end to call: freed here


def _run(mw: Any, epochs: int, steps_per_epoch: int, returns: bool) -> list[list[Any]]:
    module = LitModule(returns)
    loop = ValidationLoop()

    def step(epoch: int, i: int) -> None:
        x, y = module.data.batch()
        plain_step(module.model, module.optimizer, x, y)

    return epochs_loop(mw, epochs, steps_per_epoch, step, on_epoch_end=lambda e: loop.run(
        module, max(1, steps_per_epoch // VAL_FRACTION)))


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, returns=True)
