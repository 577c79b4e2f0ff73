"""Reported leak: every epoch's per-step model outputs kept for the whole training run.

Thread: https://github.com/microsoft/InnerEye-DeepLearning/pull/209 ("Do not persist model
outputs across epochs"). InnerEye's ``model_train`` appended each epoch's
``ModelOutputsAndMetricsForEpoch`` (its metrics *and* the model outputs of every step: logits or
segmentation posteriors, and labels) to ``train_results_per_epoch``/``val_results_per_epoch``,
lists that live for the whole run. The PR removed that persistence because it can run the
process out of memory, and keeps only each epoch's metrics.

Reproduction: a small dense-prediction model (16 positions x 16 classes per sample) trains;
``train_epoch`` returns the epoch's metrics and, per step, the loss, the posteriors as a numpy
array (64 KiB) and the labels (8 KiB), as InnerEye's segmentation steps do. The training function
appends each epoch's result object to its local ``train_results_per_epoch``, so every step's
outputs stay alive until the run ends: 72 KiB per step, across epochs. Fixed twin:
``fix_outputs_across_epochs`` (only ``.metrics`` is appended, as in the PR).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, MLP, Data

SOURCE = "https://github.com/microsoft/InnerEye-DeepLearning/pull/209"
POSITIONS = 16
CLASSES = 16

SCENARIO = Scenario(
    name="rep_outputs_across_epochs",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="train_results_per_epoch",
    description="InnerEye#209: each epoch's per-step outputs appended to a run-long list",
    # posteriors (float32) + labels (int64) of every step
    planted_bytes_per_step=BATCH * POSITIONS * (CLASSES * 4 + 8),
    source=SOURCE,
    reported=True,
)


@dataclass
class StepOutputs:
    loss: float
    posteriors: np.ndarray
    labels: torch.Tensor


@dataclass
class EpochResults:
    metrics: dict[str, float]
    model_outputs: list[StepOutputs] = field(default_factory=list)


def _run(mw: Any, epochs: int, steps_per_epoch: int, fixed: bool) -> list[list[Any]]:
    torch.manual_seed(0)
    model = MLP(classes=POSITIONS * CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = Data()
    g = torch.Generator().manual_seed(5)

    def train_epoch() -> EpochResults:
        result = EpochResults(metrics={})
        losses = []
        for _ in range(steps_per_epoch):
            x, _ = data.batch()
            labels = torch.randint(0, CLASSES, (BATCH, POSITIONS), generator=g)
            logits = model(x).view(BATCH, CLASSES, POSITIONS)
            loss = nn.functional.cross_entropy(logits, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            posteriors = torch.softmax(logits.detach(), dim=1).numpy()
            result.model_outputs.append(StepOutputs(loss.item(), posteriors, labels))
            losses.append(loss.item())
            mw.step()
        result.metrics["loss"] = float(np.mean(losses))
        return result

    def model_train() -> list[list[Any]]:
        findings: list[list[Any]] = []
        train_results_per_epoch: list[Any] = []
        for _ in range(epochs):
            epoch_results = train_epoch()
            if fixed:
                train_results_per_epoch.append(epoch_results.metrics)  # the PR's fix
            else:
                train_results_per_epoch.append(epoch_results)  # keeps every step's outputs
            del epoch_results
            findings.append(mw.end_epoch())
        return findings

    return model_train()


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=False)
