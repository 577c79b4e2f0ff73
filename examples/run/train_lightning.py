"""A Lightning training script that knows nothing of memwatch: run it under ``memwatch run``.

    python examples/run/train_lightning.py
    memwatch run --check-every-n-steps 50 -- python examples/run/train_lightning.py --leak

Under ``memwatch run`` a ``MemWatchCallback`` is added to the ``Trainer`` when it is created
(samples per optimizer step, verdicts at epoch ends and every ``--check-every-n-steps`` steps).
``--leak`` plants the bug: ``training_step`` keeps a 256 KiB tensor per step in ``self.kept``,
which memwatch names as the holder (``Regressor.kept``).
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import lightning.pytorch as L
import torch
from torch import nn


class Regressor(L.LightningModule):
    def __init__(self, leak: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        self.leak = leak
        self.kept: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.leak:
            self.kept.append(torch.ones(65536))
        return (self.net(x).squeeze(-1) - y).pow(2).mean()

    def on_train_epoch_end(self) -> None:
        print(f"epoch {self.current_epoch} done at step {self.global_step}", flush=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=100, help="optimizer steps per epoch")
    ap.add_argument("--leak", action="store_true", help="keep 256 KiB per step (the bug)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", module="lightning")  # its CPU-only advice
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batches * 8, 16, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1))
    trainer = L.Trainer(max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0)
    trainer.fit(Regressor(args.leak), torch.utils.data.DataLoader(data, batch_size=8))
    print(f"trained {trainer.global_step} steps")


if __name__ == "__main__":
    main()
