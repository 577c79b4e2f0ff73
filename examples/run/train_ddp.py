"""A torch.distributed (DDP, gloo on CPU) loop that knows nothing of memwatch: run it under
``memwatch run`` with torchrun, and every rank is watched.

    torchrun --nproc-per-node 2 examples/run/train_ddp.py
    memwatch run --check-every-n-steps 50 --out-dir ddp-run -- \\
        torchrun --nproc-per-node 2 examples/run/train_ddp.py --leak-rank 1

Each rank's memwatch writes under ``<out-dir>/rank<N>``. ``--leak-rank R`` plants the bug on rank R
only (a 256 KiB tensor per step kept in the module-level list ``kept``): rank R reports the leak,
and rank 0 reports that only rank R leaks (memwatch's ranks exchange a summary at checks).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

kept: list[torch.Tensor] = []  # where --leak-rank keeps what it keeps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--leak-rank", type=int, default=-1, metavar="R")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(8, 16)
        loss = (model(x).squeeze(-1) - x.sum(dim=1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == args.leak_rank:
            kept.append(torch.ones(65536))
        if rank == 0 and step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"trained {args.steps} steps on {dist.get_world_size()} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
