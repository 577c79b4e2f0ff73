"""Produce one finding of every kind and print it: the source of docs/findings.md.

Device-side kinds use scripted FakeDevice counters (no GPU needed); the host leak is a real CPU
training loop whose evaluation keeps its outputs with their autograd graphs, and the mapped file a
real loop reading a dataset through ``np.memmap``.

    python examples/findings_gallery.py            # all kinds
    python examples/findings_gallery.py --quick    # fewer steps (CI; or MEMWATCH_EXAMPLE_QUICK=1)
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
from collections.abc import Callable

import numpy as np
import torch

import memwatch
from memwatch.testing import FakeDevice

GIB, MIB = 1 << 30, 1 << 20
QUICK = "--quick" in sys.argv or os.environ.get("MEMWATCH_EXAMPLE_QUICK") == "1"
STEPS = 150 if QUICK else 300
rng = np.random.default_rng(0)


def show(f: memwatch.Finding) -> None:
    print(f"--- {f.kind} · {f.metric} · {f.severity} (epoch {f.epoch})")
    print(textwrap.fill(f.message, 96))
    if f.culprit:
        print("culprit:", f.culprit)
    if f.bytes_per_step is not None:
        print(f"bytes_per_step: {f.bytes_per_step:,.0f}", end="")
        if f.steps_to_oom is not None:
            print(f"   steps_to_oom: {f.steps_to_oom:,.0f}", end="")
        print()
    for s in f.suggestions[:2]:
        print(textwrap.fill("- " + s, 96, subsequent_indent="  "))
    print()


def scripted(name: str, alloc: Callable[[int, int], float], reserved: Callable[[int, int], float]
             | None = None, epochs: int = 3, total: int = 16 * GIB) -> None:
    dev = FakeDevice(total_bytes=total)
    seen: set[str] = set()
    with memwatch.watch(device=dev, host=False, workers=False, census="never",
                        out_dir=tempfile.mkdtemp()) as mw:
        s = 0
        for _e in range(epochs):
            for i in range(STEPS):
                a = alloc(i, s)
                r = reserved(i, s) if reserved else a
                dev.set(allocated=int(a), reserved=int(r))
                mw.step()
                s += 1
            for f in mw.end_epoch():
                if f.kind not in seen:  # the first of each kind is enough for a gallery
                    seen.add(f.kind)
                    show(f)


def host_leak() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    val_outputs = []
    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp()) as mw:
        for _epoch in range(3):
            for _ in range(250):
                x, y = torch.randn(32, 64), torch.randn(32, 1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                val_outputs.append(model(torch.randn(32, 64)))  # the bug: no torch.no_grad()
                mw.step()
            for f in mw.end_epoch():
                show(f)
                return


def mapped_dataset() -> None:
    """Token ids read through np.memmap, a quarter of the file per epoch (as nanoGPT's train.bin):
    RSS grows by the file's pages, anonymous memory stays flat."""
    epochs, size = 4, 96 * MIB
    path = os.path.join(tempfile.mkdtemp(), "train.bin")
    rng.integers(0, 50_000, size // 2, dtype=np.uint16).tofile(path)
    data = np.memmap(path, dtype=np.uint16, mode="r")
    chunk = len(data) // (epochs * STEPS)
    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp()) as mw:
        s = 0
        for _epoch in range(epochs):
            for _ in range(STEPS):
                x = torch.from_numpy(data[s * chunk:(s + 1) * chunk].astype(np.int64))
                float(x.float().mean())  # the "model"
                s += 1
                mw.step()
            for f in mw.end_epoch():
                show(f)
                return


def main() -> None:
    print("== leak (device, scripted: 100 kB/step with noise)")
    scripted("leak", lambda i, s: GIB + s * 100_000 + rng.normal(0, 2e6))
    print("== accumulation (released at every epoch end)")
    scripted("accumulation", lambda i, s: GIB + i * 200_000 + rng.normal(0, 2e5))
    print("== plateau (warm-up that levels off)")
    scripted("plateau", lambda i, s: GIB + 300e6 * (1 - np.exp(-s / (STEPS / 2))))
    print("== step_change (a buffer allocated once)")
    scripted("step", lambda i, s: GIB + (200e6 if s > 1.5 * STEPS else 0) + rng.normal(0, 2e5))
    print("== fragmentation (reserved grows, allocated flat)")
    scripted("frag", lambda i, s: 4 * GIB + rng.normal(0, 20 * MIB),
             lambda i, s: 5 * GIB + s * 2 * MIB)
    print("== near_oom (peak within 10% of capacity)")
    scripted("near", lambda i, s: 0.95 * 16 * GIB + rng.normal(0, 1e5), epochs=1)
    print("== leak (host, real CPU loop: evaluation outputs kept with their graphs)")
    host_leak()
    print("== mapped_file (host, real CPU loop reading a dataset through np.memmap)")
    mapped_dataset()


if __name__ == "__main__":
    main()
