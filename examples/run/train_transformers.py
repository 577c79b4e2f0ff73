"""A Hugging Face ``Trainer`` script that knows nothing of memwatch: run it under
``memwatch run``.

    python examples/run/train_transformers.py
    memwatch run --check-every-n-steps 50 -- python examples/run/train_transformers.py --leak

Under ``memwatch run`` a ``MemWatchCallback`` is added to the ``Trainer`` when it is created;
its report and bundles go to ``<output_dir>/memwatch`` (``--output-dir``, default
``memwatch-run-hf``) unless ``memwatch run --out-dir`` says otherwise. ``--leak`` plants the bug:
the model's ``forward`` keeps a 256 KiB tensor per training step in ``self.kept``.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Regressor(nn.Module):
    def __init__(self, leak: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        self.leak = leak
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.training and self.leak:
            self.kept.append(torch.ones(65536))
        return {"loss": (self.net(x).squeeze(-1) - labels).pow(2).mean()}


class Pairs(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.x[i].sum()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=100, help="optimizer steps per epoch")
    ap.add_argument("--output-dir", default="memwatch-run-hf")
    ap.add_argument("--leak", action="store_true", help="keep 256 KiB per step (the bug)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    targs = TrainingArguments(args.output_dir, use_cpu=True, num_train_epochs=args.epochs,
                              per_device_train_batch_size=8, report_to=[], save_strategy="no",
                              disable_tqdm=True, logging_steps=args.batches, seed=0,
                              dataloader_num_workers=0)
    trainer = Trainer(Regressor(args.leak), targs, train_dataset=Pairs(args.batches * 8))
    out = trainer.train()
    print(f"trained {out.global_step} steps")


if __name__ == "__main__":
    main()
