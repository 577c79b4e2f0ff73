"""Reported non-leak: every step's outputs kept for ``training_epoch_end``, freed at the epoch end.

Thread: https://github.com/Lightning-AI/pytorch-lightning/issues/15514 ("OOM when implementing
training_epoch_end"), labelled *working as intended*. The user's ``training_step`` returned
``{"loss": loss, "x": x}`` with a large ``x`` and the LightningModule overrode
``training_epoch_end``; Lightning (1.7) then keeps every step's output until the epoch ends so it
can pass them to that hook, and memory grew through each epoch until it ran out. The reporter
concluded that this is the intended behaviour, not a bug (the maintainers' label agrees): the
outputs are released when the epoch ends, and the advice was to return only what the epoch-end
hook needs.

Reproduction: a minimal Lightning-1.x-style fit loop. The module's ``training_step`` returns the
loss and its input batch ``x`` (64 KiB); because the module overrides ``training_epoch_end``, the
loop appends each output (tensors detached, as Lightning does) to ``epoch_outputs``, calls the
hook at the epoch end and then drops the list. Memory rises by 64 KiB per step within each epoch
and falls back at each epoch end: accumulation, not a leak. Twin: ``fix_epoch_end_outputs`` (the
module does not override the hook, so nothing is kept).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import epochs_loop, setup

SOURCE = "https://github.com/Lightning-AI/pytorch-lightning/issues/15514"

SCENARIO = Scenario(
    name="rep_epoch_end_outputs",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="lightning#15514: outputs kept for training_epoch_end, released at the epoch end",
    expected_kind="accumulation",
    source=SOURCE,
    reported=True,
)


class LitModel:
    """The hooks that matter of a LightningModule (``model``, ``optimizer``, the step)."""

    def __init__(self) -> None:
        self.model, self.optimizer, self.data = setup()
        self.epoch_means: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        return {"loss": loss, "x": x}


class LitModelWithEpochEnd(LitModel):
    def training_epoch_end(self, outputs: list[dict[str, torch.Tensor]]) -> None:
        self.epoch_means.append(float(torch.stack([o["loss"] for o in outputs]).mean()))


class FitLoop:
    """Lightning 1.x's rule: keep step outputs only when ``training_epoch_end`` is overridden."""

    def __init__(self, module: LitModel) -> None:
        self.module = module
        self.keep_outputs = hasattr(module, "training_epoch_end")
        self.epoch_outputs: list[dict[str, torch.Tensor]] = []

    def step(self) -> None:
        m = self.module
        out = m.training_step(m.data.batch())
        m.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        m.optimizer.step()
        if self.keep_outputs:
            self.epoch_outputs.append({k: v.detach() for k, v in out.items()})

    def end_epoch(self) -> None:
        if self.keep_outputs:
            self.module.training_epoch_end(self.epoch_outputs)  # type: ignore[attr-defined]
        self.epoch_outputs = []  # released here: the memory comes back every epoch


def _run(mw: Any, epochs: int, steps_per_epoch: int, override: bool) -> list[list[Any]]:
    loop = FitLoop(LitModelWithEpochEnd() if override else LitModel())
    return epochs_loop(mw, epochs, steps_per_epoch, lambda epoch, i: loop.step(),
                       on_epoch_end=lambda epoch: loop.end_epoch())


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, override=True)
