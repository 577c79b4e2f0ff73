"""A data-parallel (or FSDP2) training loop on gloo/CPU under memwatch.watch(), for the
multi-node and sharded-training acceptance tests (issue 45). Launched by torchrun, one process
per rank:

    python job_loop.py OUT_DIR [--leak-rank R] [--oom-rank R] [--oom-epoch E] [--fsdp]
                               [--epochs E] [--steps S]

Every rank trains the same tiny model, data-parallel: its gradients are all-reduced after each
backward, as DistributedDataParallel does (without DDP's import of ``torch._dynamo``: 5 s per
process on a 2-core machine), or sharded with ``fully_shard`` on each layer (``--fsdp``).
``--leak-rank``: that rank keeps each step's hidden activation in the global list
``kept`` (64 KiB per step, held forever). ``--oom-rank``: in epoch ``--oom-epoch`` that rank caps
its address space a little above what it maps and allocates 4 MiB more per step until the host
allocator fails: a real host OOM. Its peers then fail in their next collective (gloo:
"Connection closed by peer"), unless torchrun's SIGTERM reaches them first.

Each rank writes ``OUT_DIR/report-rank<r>.json`` after every epoch end (its findings so far), so
what it knew survives its death.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rank_loop import vmsize  # beside this script (its folder is on sys.path)

import memwatch

kept: list[torch.Tensor] = []  # the planted leak lives here
ballast: list[torch.Tensor] = []  # what the OOM rank allocates until it fails


def _model(fsdp: bool) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 1))
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    else:
        for p in model.parameters():  # every rank starts from rank 0's weights
            dist.broadcast(p.data, src=0)
    return model


def _average_gradients(model: torch.nn.Module) -> None:
    world = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)  # fails when a peer died: "Connection closed by peer"
            p.grad /= world


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir", type=Path)
    p.add_argument("--leak-rank", type=int, default=-1)
    p.add_argument("--oom-rank", type=int, default=-1)
    p.add_argument("--oom-epoch", type=int, default=3)
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    a = p.parse_args()
    t_init = time.time()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    model: Any = _model(a.fsdp)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # its state appears at the first step
    report: dict[str, Any] = {"rank": rank, "epochs": [], "times": [t_init, time.time()],
                              "cpu": [time.process_time()]}
    out = a.out_dir / f"report-rank{rank}.json"
    with memwatch.watch(device="cpu", workers=False, out_dir=str(a.out_dir),
                        exchange_timeout_s=20.0, total_steps=a.epochs * a.steps) as mw:
        for epoch in range(a.epochs):
            for _ in range(a.steps):
                x, y = torch.randn(32, 64), torch.randn(32, 1)
                hidden = model[1](model[0](x))
                loss = torch.nn.functional.mse_loss(model[2](hidden), y)
                opt.zero_grad()
                loss.backward()
                if not a.fsdp:
                    _average_gradients(model)
                opt.step()
                if rank == a.leak_rank:
                    kept.append(hidden.detach().clone())  # 32 x 512 float32: 64 KiB
                if rank == a.oom_rank and epoch == a.oom_epoch:
                    if not ballast:
                        vm = vmsize()
                        resource.setrlimit(resource.RLIMIT_AS, (vm + (48 << 20),) * 2)
                    ballast.append(torch.ones(1 << 20))  # 4 MiB per step until it fails
                mw.step()
            fs = mw.end_epoch()
            report["epochs"].append([f.to_dict() for f in fs])
            report["times"].append(time.time())
            report["cpu"].append(time.process_time())
            out.write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
