"""Reported non-leak: the evaluation loop keeps the last validation's outputs until the next one.

Thread: https://github.com/Lightning-AI/pytorch-lightning/issues/5735 ("Bounded memory leak
caused by `trainer.evalutaion_loop.outputs`"). Lightning 1.1's evaluation loop cached every
validation step's output in ``trainer.evaluation_loop.outputs`` and only reset the list at the
start of the next validation, so one validation's outputs stayed in memory through the following
training epoch. The reporter titled it a *bounded* leak: the memory does not grow, it is held
one validation longer than needed; the maintainers freed the list at the validation epoch end
(PR 6326).

Reproduction: a minimal Lightning-1.1-style fit loop with a validation at every epoch end
(a quarter as many batches as training steps). ``validation_step`` returns the batch's
predictions and features (128 KiB); the evaluation loop appends each output to
``evaluation_loop.outputs``, which it resets only when the next validation starts. After the
first validation the training steps see a constant ~5 MiB more, replaced but not increased by
every later validation. A correct verdict is bounded (a step, then flat), not a leak. Twin:
``fix_eval_outputs_kept`` (the outputs are released at the validation end, as in PR 6326).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, epochs_loop, plain_step, setup

SOURCE = "https://github.com/Lightning-AI/pytorch-lightning/issues/5735"
VAL_FRACTION = 4

SCENARIO = Scenario(
    name="rep_eval_outputs_kept",
    is_leak=False,
    leak_start_epoch=None,
    expected_metric="host",
    expected_culprit=None,
    description="lightning#5735: last validation's outputs kept until the next validation",
    expected_kind="bounded",
    source=SOURCE,
    reported=True,
)


class EvaluationLoop:
    """Lightning 1.1's evaluation loop, reduced to its ``outputs`` bookkeeping."""

    def __init__(self, release_at_end: bool) -> None:
        self.outputs: list[dict[str, torch.Tensor]] = []
        self.release_at_end = release_at_end

    def run(self, model: nn.Module, batches: list[torch.Tensor]) -> float:
        self.outputs = []  # reset only when a validation starts
        model.eval()
        with torch.no_grad():
            for x in batches:
                feats = torch.relu(model.fc1(x))  # type: ignore[operator]
                self.outputs.append({"preds": model(x), "feats": feats,
                                     "x": x.clone()})
        model.train()
        score = float(torch.stack([o["preds"].mean() for o in self.outputs]).mean())
        if self.release_at_end:
            self.outputs = []  # the fix (PR 6326): free them at the validation epoch end
        return score


evaluation_loop: EvaluationLoop | None = None


def _run(mw: Any, epochs: int, steps_per_epoch: int, release: bool) -> list[list[Any]]:
    global evaluation_loop
    model, opt, data = setup()
    evaluation_loop = loop = EvaluationLoop(release)
    scores: list[float] = []

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)

    def validate(epoch: int) -> None:
        batches = [data.batch(BATCH)[0] for _ in range(max(1, steps_per_epoch // VAL_FRACTION))]
        scores.append(loop.run(model, batches))

    return epochs_loop(mw, epochs, steps_per_epoch, step, on_epoch_end=validate)


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, release=False)
