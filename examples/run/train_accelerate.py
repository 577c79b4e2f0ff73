"""An Accelerate training loop that knows nothing of memwatch: run it under ``memwatch run``.

    python examples/run/train_accelerate.py
    memwatch run --check-every-n-steps 50 -- python examples/run/train_accelerate.py --leak
    memwatch run -- accelerate launch --multi_gpu --num_processes 2 \\
        examples/run/train_accelerate.py                  # two CPU processes on gloo

Under ``memwatch run`` the Accelerate hook is attached to the prepared optimizer at its first
step (one sample per real optimizer step; epochs end with the prepared DataLoader). ``--leak``
plants the bug: the loop keeps a 256 KiB tensor per step in the module-level list ``kept``.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch import nn

kept: list[torch.Tensor] = []  # where --leak keeps what it keeps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=100, help="optimizer steps per epoch")
    ap.add_argument("--leak", action="store_true", help="keep 256 KiB per step (the bug)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batches * 8, 16, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = accelerator.prepare(
        model, opt, torch.utils.data.DataLoader(data, batch_size=8))
    for epoch in range(args.epochs):
        for xb, yb in loader:
            loss = (model(xb).squeeze(-1) - yb).pow(2).mean()
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            if args.leak:
                kept.append(torch.ones(65536))
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.print(f"trained {args.epochs * len(loader)} steps")


if __name__ == "__main__":
    main()
