"""A training loop watched by memwatch that memory kills: run by tests/test_kernel_oom.py.

``python oom_kill_script.py MODE OUT_DIR``:

* ``worker``: DataLoader workers (persistent) keep 8 MiB per item they load, until the kernel's
  OOM killer kills one inside the memory cgroup the test made; the loop then fails.
* ``main``: the training process keeps 8 MiB per step until the kernel kills it (no exception).
* ``plain``: a loop that runs until someone kills it (``kill -9``), keeping nothing.

Prints ``ready`` once memwatch watches, then ``step N`` lines.
"""

from __future__ import annotations

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import memwatch

MIB = 1 << 20
KEPT: list[bytearray] = []


def _victim(_: int) -> None:
    """Make this worker the kernel's first choice: the OOM killer picks by size, and the main
    process (torch, memwatch, received batches) is sometimes larger than a worker at the moment
    of the kill (1 run in ~15 on this machine). The test is about a killed worker."""
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


class Growing(Dataset[torch.Tensor]):
    """Each item read keeps 8 MiB in the worker that read it (a per-worker cache gone wrong)."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        KEPT.append(bytearray(8 * MIB))  # bytearray(n) is zeroed: its pages are touched
        return torch.zeros(4)


def main() -> int:
    mode, out_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watchdog = {"every_n_steps": 1, "on_critical": ("alert", "bundle")}
    with memwatch.watch(device="cpu", workers=(mode == "worker"), out_dir=out_dir,
                        interval_s=0.1, blackbox_every_s=0.3, watchdog=watchdog,
                        signals=False) as mw:
        print("ready", flush=True)
        if mode == "worker":
            loader = DataLoader(Growing(), batch_size=1, num_workers=2, persistent_workers=True,
                                worker_init_fn=_victim)
            batches = iter(loader)
        for step in range(1_000_000):
            x = next(batches) if mode == "worker" else torch.zeros(1, 4)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if mode == "main":
                KEPT.append(bytearray(8 * MIB))
            mw.step()
            print(f"step {step + 1}", flush=True)
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
