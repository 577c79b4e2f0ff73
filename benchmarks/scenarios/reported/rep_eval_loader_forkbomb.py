"""Reported leak: a new persistent-worker eval DataLoader at every evaluation (worker processes).

Thread: https://github.com/huggingface/transformers/issues/28469
("`dataloader_persistent_workers=True` causes fork-bomb due to repeated creation of
`eval_dataloader`"). With persistent workers on, ``Trainer.evaluate()`` built and
``accelerator.prepare()``-d a fresh eval DataLoader every time; the prepared loaders stay
referenced (Accelerate keeps every prepared DataLoader, as sentence-transformers PR 3895
explains), so each evaluation left its worker processes alive and their number grew with every
evaluation (the "fork bomb" of the title).
The maintainers treated it as a bug and fixed it by creating the eval DataLoader once and reusing
it (transformers PR 29538, completed by PR 39717, which caches the *prepared* loader).

Reproduction: a small ``Trainer`` trains on main-process batches and calls ``evaluate()`` every
``EVAL_EVERY`` steps. ``evaluate()`` builds ``DataLoader(eval_set, num_workers=2,
persistent_workers=True)``, passes it through ``MiniAccelerator.prepare`` (which appends it to
``_dataloaders``, as Accelerate does) and iterates it once. Two new workers per evaluation stay
alive for the rest of the run: ``workers.count`` grows by 2 each time and ``workers.uss`` by the
new workers' private pages. The holder in the main process is ``accelerator._dataloaders``.
Fixed twin: ``fix_eval_loader_forkbomb`` (the loader is built once and reused).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .. import Scenario
from .._common import CLASSES, IN_DIM, epochs_loop, plain_step, setup

SOURCE = "https://github.com/huggingface/transformers/issues/28469"
EVAL_EVERY = 50
EVAL_SAMPLES = 512
WORKERS = 2
#: Measured: the private pages (USS) two freshly forked workers hold after their first pass over
#: the eval set (17-19 MiB here, from fix_eval_loader_forkbomb's workers.uss); one pair is left
#: behind every EVAL_EVERY steps.
WORKER_PAIR_USS = int(17.5 * (1 << 20))

SCENARIO = Scenario(
    name="rep_eval_loader_forkbomb",
    is_leak=True,
    leak_start_epoch=0,
    expected_metric="workers",
    expected_culprit="_dataloaders",
    description="transformers#28469: new persistent-worker eval DataLoader at every evaluate()",
    expected_kind="worker_count",
    workers=True,
    planted_bytes_per_step=WORKER_PAIR_USS / EVAL_EVERY,
    source=SOURCE,
    reported=True,
)


class MiniAccelerator:
    """What matters here of ``accelerate.Accelerator``: ``prepare`` keeps every DataLoader."""

    def __init__(self) -> None:
        self._dataloaders: list[DataLoader[Any]] = []

    def prepare(self, dataloader: DataLoader[Any]) -> DataLoader[Any]:
        self._dataloaders.append(dataloader)
        return dataloader

    def free_memory(self) -> None:
        for dl in self._dataloaders:
            it = getattr(dl, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
        self._dataloaders.clear()


class Trainer:
    def __init__(self, model: nn.Module, eval_set: TensorDataset, cache_eval_loader: bool):
        self.model = model
        self.eval_set = eval_set
        self.accelerator = MiniAccelerator()
        self.cache_eval_loader = cache_eval_loader
        self._eval_dataloader: DataLoader[Any] | None = None
        self.eval_losses: list[float] = []

    def get_eval_dataloader(self) -> DataLoader[Any]:
        if self.cache_eval_loader and self._eval_dataloader is not None:
            return self._eval_dataloader  # the fix: reuse the prepared loader
        dl = DataLoader(self.eval_set, batch_size=64, num_workers=WORKERS,
                        persistent_workers=True)
        dl = self.accelerator.prepare(dl)
        if self.cache_eval_loader:
            self._eval_dataloader = dl
        return dl

    def evaluate(self) -> None:
        self.model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in self.get_eval_dataloader():
                total += nn.functional.cross_entropy(self.model(x), y).item()
        self.eval_losses.append(total)
        self.model.train()


trainer: Trainer | None = None


def _run(mw: Any, epochs: int, steps_per_epoch: int, fixed: bool) -> list[list[Any]]:
    global trainer
    model, opt, data = setup()
    g = torch.Generator().manual_seed(3)
    eval_set = TensorDataset(torch.randn(EVAL_SAMPLES, IN_DIM, generator=g),
                             torch.randint(0, CLASSES, (EVAL_SAMPLES,), generator=g))
    trainer = t = Trainer(model, eval_set, cache_eval_loader=fixed)

    def step(epoch: int, i: int) -> None:
        x, y = data.batch()
        plain_step(model, opt, x, y)
        if i % EVAL_EVERY == EVAL_EVERY - 1:
            t.evaluate()

    try:
        return epochs_loop(mw, epochs, steps_per_epoch, step)
    finally:
        t.accelerator.free_memory()  # after the last end_epoch(): stop the workers we made


def run(mw: Any, epochs: int, steps_per_epoch: int) -> list[list[Any]]:
    return _run(mw, epochs, steps_per_epoch, fixed=False)
