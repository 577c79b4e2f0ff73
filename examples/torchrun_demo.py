"""A two-rank job where one rank leaks and dies of host OOM: what memwatch shows afterwards.

    python examples/torchrun_demo.py

Launches itself with ``torchrun --nproc_per_node=2`` (CPU, gloo). Each rank trains a small model
under ``memwatch.watch()`` with its own output folder, data-parallel: the gradients are
all-reduced after each backward. Rank 1 keeps a tensor every step (the leak); at the end of its
third epoch the example caps rank 1's address space, so the leak kills it with a real host OOM a
few steps later, and memwatch writes its bundle. Rank 0's next all-reduce then fails ("Connection
closed by peer"): memwatch classifies that as a ``peer_failure``, writes rank 0's bundle, and
names rank 1 as the rank that failed first (the job's store told it). torchrun's failure summary
names both bundles. Finally the example runs ``memwatch ls``, ``memwatch inspect`` and
``memwatch report`` on the job's folder: one job, rank 1 failed first, what rank 0 looked like at
that moment, and one HTML report of the job (``torchrun-demo/job.html``).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

OUT = Path("torchrun-demo")


def rank_main() -> None:
    import torch
    import torch.distributed as dist

    import memwatch

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept: list[torch.Tensor] = []
    with memwatch.watch(device="cpu", workers=False, out_dir=str(OUT / f"rank{rank}"),
                        exchange_timeout_s=5) as mw:
        for epoch in range(5):
            for _ in range(80):
                x, y = torch.randn(32, 64), torch.randn(32, 1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                for p in model.parameters():  # what DistributedDataParallel does
                    dist.all_reduce(p.grad)
                    p.grad /= 2
                opt.step()
                if rank == 1:
                    kept.append(torch.randn(32, 512))  # the bug: 64 KiB per step, kept forever
                    if epoch == 3:
                        kept.append(torch.ones(1 << 20))  # ... and 4 MiB more, until it dies
                mw.step()
            for f in mw.end_epoch():
                print(f"[rank {rank}] epoch {epoch}: {f.kind} {f.metric}: {f.culprit or ''}",
                      flush=True)
            if rank == 1 and epoch == 2:
                # A memory limit a little above what is mapped now: a real host OOM follows.
                with open("/proc/self/status") as st:
                    vm = next(int(ln.split()[1]) * 1024 for ln in st if ln.startswith("VmSize:"))
                resource.setrlimit(resource.RLIMIT_AS, (vm + (48 << 20),) * 2)
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", MEMWATCH_DEMO_RANK="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={port}", __file__]
    print("$ torchrun", " ".join(cmd[3:]), flush=True)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    print("\n".join(ln for ln in r.stdout.splitlines() if ln.startswith("[rank")))
    print(f"torchrun exited with {r.returncode} (rank 1 died of OOM, as planned); its summary:")
    summary = r.stderr.split("Failures:", 1)[-1].splitlines()
    print("\n".join(ln for ln in summary if ln.lstrip().startswith(
        ("rank ", "error_file", "memwatch:", "Root Cause"))) + "\n", flush=True)

    from memwatch.cli import main as memwatch_cli

    print(f"$ memwatch ls {OUT}", flush=True)
    memwatch_cli(["ls", str(OUT)])
    print(f"\n$ memwatch inspect {OUT}", flush=True)
    code = memwatch_cli(["inspect", str(OUT)])
    print(f"\n$ memwatch report {OUT} -o {OUT / 'job.html'}", flush=True)
    sys.exit(code or memwatch_cli(["report", str(OUT), "-o", str(OUT / "job.html")]))


if __name__ == "__main__":
    if os.environ.get("MEMWATCH_DEMO_RANK"):
        rank_main()
    else:
        main()
