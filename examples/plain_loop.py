"""memwatch in a plain PyTorch training loop: the whole integration is three lines.

A tiny MLP learns a synthetic classification task on the CPU, fed by a real DataLoader with two
worker processes. memwatch samples host, worker (and, on a GPU machine, device) memory once per
optimizer step and gives its verdicts at every epoch end.

    python examples/plain_loop.py                       # 3 epochs, a few seconds
    python examples/plain_loop.py --epochs 2 --steps 5  # shorter
    python examples/plain_loop.py --leak                # keep every loss *with its graph*

``MEMWATCH_EXAMPLE_QUICK=1`` makes the defaults tiny (the test suite runs every example that way).

``--leak`` plants a classic bug: a loss computed for logging only (on a fixed monitoring batch,
outside ``torch.no_grad()``) is kept in a list as a tensor instead of ``loss.item()``. Nothing
calls ``backward()`` on it, so each kept loss holds its whole autograd graph and the activations
the graph saved: about half a MiB per step here.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import memwatch
from memwatch.core.units import fmt_bytes

# The planted leak's container (module level, as such lists usually are).
loss_history: list[Any] = []


def make_loader(steps: int, batch: int, workers: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, 256, generator=g)
    y = (x[:, :10].argmax(dim=1)).long()  # a learnable rule
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, num_workers=workers,
                      persistent_workers=workers > 0)


def summary_line(latest: dict[str, float]) -> str:
    parts = [f"host.rss {fmt_bytes(latest.get('host.rss'))}",
             f"host.uss {fmt_bytes(latest.get('host.uss'))}"]
    if "workers.count" in latest:
        parts.append(f"workers {latest['workers.count']:.0f} "
                     f"(pss {fmt_bytes(latest.get('workers.pss'))})")
    if "device.allocated" in latest:
        parts.append(f"device.allocated {fmt_bytes(latest['device.allocated'])}")
    return ", ".join(parts)


def train(epochs: int = 3, steps: int = 40, batch: int = 64, workers: int = 2,
          leak: bool = False, out_dir: str = "memwatch-out") -> list[memwatch.Finding]:
    torch.manual_seed(0)
    # A model this small runs fastest on one thread (and leaves the other cores to the workers).
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = make_loader(steps, batch, workers)
    monitor_x = torch.randn(batch, 256)
    monitor_y = monitor_x[:, :10].argmax(dim=1)

    with memwatch.watch(out_dir=out_dir, interval_s=0.25) as mw:       # 1. start watching
        for epoch in range(epochs):
            total = 0.0
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if leak:
                    # The bug: a tensor with its graph; `.item()` (or torch.no_grad()) fixes it.
                    loss_history.append(nn.functional.cross_entropy(model(monitor_x), monitor_y))
                total += loss.item()
                mw.step()                                              # 2. once per step
            findings = mw.end_epoch()                                  # 3. verdicts
            print(f"epoch {epoch}: mean loss {total / len(loader):.3f}; "
                  f"{summary_line(mw.latest())}")
            for f in findings:
                print(f"  [{f.severity}] {f.kind} {f.metric}: {f.message}")
                for s in f.suggestions:
                    print(f"      - {s}")
            if not findings:
                print("  no findings")
    print(f"latest(): {len(mw.latest())} metrics: {', '.join(sorted(mw.latest()))}")
    return mw.findings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="memwatch in a plain PyTorch loop")
    quick = bool(os.environ.get("MEMWATCH_EXAMPLE_QUICK"))  # the test suite's short run
    ap.add_argument("--epochs", type=int, default=2 if quick else 3)
    ap.add_argument("--steps", type=int, default=5 if quick else 40, help="steps per epoch")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--leak", action="store_true", help="plant a leak: keep losses with graphs")
    ap.add_argument("--out-dir", default="memwatch-out")
    args = ap.parse_args(argv)
    findings = train(args.epochs, args.steps, workers=args.workers, leak=args.leak,
                     out_dir=args.out_dir)
    print(f"{len(findings)} finding(s) in total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
