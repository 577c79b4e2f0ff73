"""A plain PyTorch training loop that knows nothing of memwatch: run it under ``memwatch run``.

    python examples/run/train_plain.py                      # trains; memwatch is not involved
    memwatch run --check-every-n-steps 50 -- python examples/run/train_plain.py --leak

Under ``memwatch run`` every ``optimizer.step()`` is a sample (torch's process-wide optimizer
step hook) and a check runs every ``--check-every-n-steps`` steps. ``--leak`` plants the bug:
the loop keeps a 256 KiB tensor of every step in the module-level list ``kept``; memwatch names
that list as the holder at the second or third check after the leak starts.

``--hog MIB`` keeps MIB of (untouched) address space per step instead: under an address-space
limit (``ulimit -v``) the run dies of a host OOM and memwatch writes a bundle.
``--wandb`` logs the loss to an offline W&B run (``WANDB_MODE=offline``): memwatch's keys and
panels land in the same run.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

kept: list[torch.Tensor] = []  # where --leak and --hog keep what they keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--leak", action="store_true", help="keep 256 KiB per step (the bug)")
    ap.add_argument("--hog", type=int, default=0, metavar="MIB",
                    help="keep MIB of address space per step")
    ap.add_argument("--wandb", action="store_true", help="log to an offline W&B run")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    run = None
    if args.wandb:
        import wandb

        run = wandb.init(project="memwatch-run-demo", mode="offline")
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(8, 16)
        loss = (model(x).squeeze(-1) - x.sum(dim=1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.leak:
            kept.append(torch.ones(65536))
        if args.hog:
            kept.append(torch.empty(args.hog * 2**18))  # MIB of float32, never written
        if run is not None:
            run.log({"loss": loss.item()})
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    print(f"trained {args.steps} steps")
    if run is not None:
        run.finish()


if __name__ == "__main__":
    main()
