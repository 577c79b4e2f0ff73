"""Tiny Lightning models and data for the memwatch end-to-end suites (CPU, seconds per fit)."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from memwatch.testing import malloc_trim  # noqa: F401 - the tests import it from here

N_IN = 32


class Regressor(L.LightningModule):
    """An MLP regressor; ``leak_from_epoch`` plants the classic leak from that epoch on.

    The leak: ``training_step`` keeps a prediction *with its autograd graph* in ``self.history``
    every step (instead of ``.detach()`` or ``.item()``), so each step's saved activations stay
    alive.
    """

    def __init__(self, width: int = 2048, leak_from_epoch: int | None = None,
                 fail_at_step: int | None = None, hog_mib: int = 0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_IN, width), nn.ReLU(), nn.Linear(width, 1))
        self.leak_from_epoch = leak_from_epoch
        self.fail_at_step = fail_at_step
        self.hog_mib = hog_mib
        self.history: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        if self.leak_from_epoch is not None and self.current_epoch >= self.leak_from_epoch:
            # The planted bug: predictions kept for "later analysis" without .detach(): each
            # one keeps its autograd graph and saved activations alive. (Keeping the loss itself
            # after backward() holds only small graph nodes: backward frees saved tensors.)
            self.history.append(self.net(x))
        if self.hog_mib:
            # A runaway cache: keeps a fresh block every step until memory runs out.
            self.history.append(torch.ones(self.hog_mib << 18))  # hog_mib MiB of float32
        if self.fail_at_step is not None and self.global_step >= self.fail_at_step:
            raise ValueError("boom: a bug in training_step")
        self.log("train_loss", loss.detach(), on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class CachingRegressor(Regressor):
    """Keeps a growing cache that is saved in (and restored from) every checkpoint.

    The kind of leak a restart does not cure: a replay buffer or an "all predictions" list that
    travels with the checkpoint, so the resumed process starts where the old one stopped.
    """

    def __init__(self, kib_per_step: int = 512, **kw: Any) -> None:
        super().__init__(**kw)
        self.kib_per_step = kib_per_step
        self.cache: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.cache.append(torch.randn(self.kib_per_step * 256))  # kib_per_step KiB of float32
        return super().training_step(batch, batch_idx)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["cache"] = self.cache

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.cache = list(checkpoint.get("cache", []))


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random regression samples that take a moment to load (so workers live long enough)."""

    def __init__(self, n: int, delay_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, N_IN, generator=g)
        self.y = torch.randn(n, 1, generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i], self.y[i]


def loader(n_batches: int, batch_size: int = 128, num_workers: int = 0,
           delay_s: float = 0.0, shuffle: bool = False) -> DataLoader[Any]:
    if num_workers or delay_s:
        ds: Dataset[Any] = SlowDataset(n_batches * batch_size, delay_s)
    else:
        g = torch.Generator().manual_seed(0)
        ds = TensorDataset(torch.randn(n_batches * batch_size, N_IN, generator=g),
                           torch.randn(n_batches * batch_size, 1, generator=g))
    return DataLoader(ds, batch_size=batch_size, num_workers=num_workers, shuffle=shuffle)


def make_trainer(tmp_path: Path, callbacks: list[Any], **kw: Any) -> L.Trainer:
    opts: dict[str, Any] = dict(
        accelerator="cpu", devices=1, max_epochs=2, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False,
        logger=CSVLogger(str(tmp_path), name="csv"), default_root_dir=str(tmp_path),
        num_sanity_val_steps=2,
    )
    opts.update(kw)
    return L.Trainer(callbacks=callbacks, **opts)


def read_metrics(trainer: L.Trainer) -> list[dict[str, str]]:
    """The rows of the CSVLogger's metrics.csv (empty cells are '')."""
    path = os.path.join(trainer.logger.log_dir, "metrics.csv")  # type: ignore[union-attr]
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def column(rows: list[dict[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) not in (None, "")]


class RankOneLeaks(Regressor):
    """Only global rank 1 keeps a 256 KiB tensor per step (a rank-dependent leak)."""

    kept: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_rank == 1:
            RankOneLeaks.kept.append(torch.ones(1 << 16))
        return super().training_step(batch, batch_idx)
