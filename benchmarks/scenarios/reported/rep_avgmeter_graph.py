"""Reported leak: an ``AverageMeter`` fed tensors that still carry their autograd graph.

Thread: https://github.com/visionml/pytracking/pull/313 ("Fix memory leak in
LTRTrainer._update_stats()"). The reporter found that the trainer passes each statistic to its
``AverageMeter`` as a tensor with gradients, so ``sum += val * n`` chains every step's graph onto
the meter and the graphs accumulate instead of being freed; the fix converts tensors with
``.item()`` before updating. The maintainer did not dispute the leak, only asked that non-tensor
values keep working (the PR was still open in the copy read). In
pytracking's ``ltr/admin/stats.py`` the meter's ``new_epoch()`` appends ``avg`` to ``history``
before resetting, so each epoch's chain is kept for the rest of the run: a leak across epochs.

Reproduction: a small ``LTRTrainer`` keeps ``self.stats[loader][name] = AverageMeter()`` like
pytracking's, and the actor reports two statistics as tensors: the loss (whose saved activations
``backward()`` frees, so it pins only graph nodes) and a feature-norm statistic computed off the
loss path, ``hidden.norm(dim=1).mean()``, whose ``NormBackward`` node keeps the 64 x 256 hidden
activation alive (backward never runs through it). Every step the meter's chain gains one such
activation; at each epoch end ``new_epoch()`` moves the chain into ``history``. The holder is
``ltr_trainer.stats``. Fixed twin: ``fix_avgmeter_graph`` (the PR's ``.item()``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from .. import Scenario
from .._common import BATCH, HIDDEN, epochs_loop, setup

SOURCE = "https://github.com/visionml/pytracking/pull/313"

SCENARIO = Scenario(
    name="rep_avgmeter_graph",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="host",
    expected_culprit="stats",
    description="pytracking#313: AverageMeter.update(tensor) chains graphs; history keeps them",
    # Measured (glibc in-use bytes at epoch ends, reported/README.md): the 64 KiB hidden activation
    # NormBackward saves, plus ~13 KiB of autograd nodes and tensor objects per step.
    planted_bytes_per_step=BATCH * HIDDEN * 4 + 13_000,
    source=SOURCE,
    reported=True,
)


class AverageMeter:
    """Running average with a per-epoch history, as in pytracking's ``ltr/admin/stats.py``."""

    def __init__(self) -> None:
        self.history: list[Any] = []
        self.reset()

    def reset(self) -> None:
        self.avg: Any = 0
        self.val: Any = 0
        self.sum: Any = 0
        self.count = 0

    def update(self, val: Any, n: int = 1) -> None:
        self.val = val
        self.sum += val * n  # a tensor with grad_fn: the chain grows by this step's graph
        self.count += n
        self.avg = self.sum / self.count

    def new_epoch(self) -> None:
        if self.count > 0:
            self.history.append(self.avg)  # keeps the whole epoch's chain for the run
            self.reset()


class LTRTrainer:
    """The statistics bookkeeping of pytracking's ``LTRTrainer`` (one "train" loader)."""

    def __init__(self, item_stats: bool) -> None:
        self.stats: OrderedDict[str, OrderedDict[str, AverageMeter]] = OrderedDict()
        self.item_stats = item_stats

    def update_stats(self, new_stats: dict[str, Any], batch_size: int,
                     loader: str = "train") -> None:
        meters = self.stats.setdefault(loader, OrderedDict())
        for name, val in new_stats.items():
            if self.item_stats and isinstance(val, torch.Tensor):
                val = val.item()  # the fix from the PR
            meters.setdefault(name, AverageMeter()).update(val, batch_size)

    def stats_new_epoch(self) -> None:
        for meters in self.stats.values():
            for meter in meters.values():
                meter.new_epoch()


ltr_trainer: LTRTrainer | None = None


def actor(model: nn.Module, x: torch.Tensor,
          y: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward pass; the loss and the statistics the trainer logs (tensors, as in the thread)."""
    hidden = torch.relu(model.fc1(x))
    out = model.fc3(torch.relu(model.fc2(hidden)))
    loss = nn.functional.cross_entropy(out, y)
    stats = {"Loss/total": loss, "Stats/feat_norm": hidden.norm(dim=1).mean()}
    return loss, stats


def _run(mw: Any, epochs: int, steps_per_epoch: int, fixed: bool) -> list[list[Any]]:
    global ltr_trainer
    model, opt, data = setup()
    ltr_trainer = trainer = LTRTrainer(item_stats=fixed)

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        loss, stats = actor(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        trainer.update_stats(stats, BATCH)

    return epochs_loop(mw, epochs, steps_per_epoch, step,
                       on_epoch_end=lambda epoch: trainer.stats_new_epoch())


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=False)
