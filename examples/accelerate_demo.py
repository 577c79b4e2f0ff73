"""memwatch with Hugging Face Accelerate: one line in a custom loop, a planted leak, the verdict.

The model below keeps every batch's hidden activations in ``self.history`` *with their autograd
graph* (a debugging line left in ``forward``), so memory grows by about 2 MiB per optimizer step
(256 KiB in quick mode) from the second epoch on. ``attach(accelerator, optimizer)`` samples
memory at every real optimizer step (gradient accumulation: once per 2 batches here), ends an
epoch when the prepared DataLoader is exhausted, and at each epoch end says whether memory is
leaking, how fast, and what holds it.

Metrics go through ``accelerator.log``: to an offline W&B run when ``wandb`` is installed
(nothing leaves the machine), else to no tracker at all (memwatch still samples and judges).

The second part shows ``find_executable_batch_size``: OOMs that it catches and retries with a
smaller batch are *recovered* OOMs for memwatch (no crash bundle), and the batch size it settles
on is reported. The OOMs come from :class:`memwatch.testing.FakeDevice`, a simulated GPU whose
allocator behaves like CUDA's, so the demo runs on any CPU.

    python examples/accelerate_demo.py
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_demo.py   # 2 CPU procs
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import find_executable_batch_size
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memwatch import MemWatchWarning
from memwatch.core.units import fmt_bytes
from memwatch.integrations.accelerate import attach
from memwatch.testing import FakeDevice

QUICK = os.environ.get("MEMWATCH_EXAMPLE_QUICK") == "1"
OUT = Path("accelerate-demo")


class LeakyRegressor(nn.Module):
    def __init__(self, width: int = 2048) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.out = nn.Linear(width, 1)
        self.leaking = False
        self.history: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.inp(x))
        if self.leaking:
            self.history.append(hidden)  # THE BUG: keeps activations and their graph alive
        return self.out(hidden)  # type: ignore[no-any-return]


def leak_demo() -> None:
    log_with = "wandb" if importlib.util.find_spec("wandb") else None
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, log_with=log_with,
                              project_dir=str(OUT))
    if log_with:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        accelerator.init_trackers("memwatch-accelerate-demo",
                                  init_kwargs={"wandb": {"dir": str(OUT), "mode": "offline"}})
    g = torch.Generator().manual_seed(0)
    batches = 96  # 48 optimizer steps per epoch: enough for a verdict on host memory
    # Quick mode (the test suite's): 128 KiB kept per batch instead of 1 MiB, still plenty.
    width, bs = (512, 64) if QUICK else (2048, 128)
    data = DataLoader(TensorDataset(torch.randn(batches * bs, 32, generator=g),
                                    torch.randn(batches * bs, 1, generator=g)), batch_size=bs)
    model = LeakyRegressor(width)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)

    hook = attach(accelerator, optimizer, workers=False)  # <- the one line

    for epoch in range(3):
        model.leaking = epoch >= 1  # the bug ships in epoch 1
        total = 0.0
        for x, y in data:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            total += loss.item()
        accelerator.print(f"epoch {epoch}: mean loss {total / len(data):.4f}, "
                          f"{hook.memwatch.step_count} optimizer steps so far")
    leaks = [f for f in hook.findings if f.kind == "leak"]
    if leaks:  # the latest verdict: the census names the holder from the second epoch end on
        f = leaks[-1]
        accelerator.print(f"planted leak found: {f.metric} grows "
                          f"{fmt_bytes(f.bytes_per_step or 0)}/step; held by {f.culprit}")
    else:  # the demo's point failed: say so with a non-zero exit (CI runs every example)
        raise SystemExit("no leak reported, yet the planted leak ran")
    hook.detach()
    accelerator.end_training()


def batch_size_finder_demo() -> None:
    # A fresh Accelerator for the second part (Accelerate keeps process-wide state).
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    gpu = FakeDevice(total_bytes=64 << 20, name="FakeGPU-64MiB")
    accelerator = Accelerator(cpu=True, project_dir=str(OUT))
    model = nn.Linear(32, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    hook = attach(accelerator, optimizer, device=gpu, workers=False)
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(512, 32, generator=g), torch.randn(512, 1, generator=g))

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size: int) -> int:
        data = accelerator.prepare(DataLoader(ds, batch_size=batch_size))
        for x, y in data:
            activations = gpu.malloc(batch_size << 20)  # 1 MiB per sample on the "GPU"
            accelerator.backward(F.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            gpu.free(activations)
        return batch_size

    final = train()
    bundles = list((Path(hook.memwatch.out_dir) / "oom").glob("*"))
    accelerator.print(f"find_executable_batch_size settled on {final}; memwatch saw "
                      f"{hook.recovered_oom_count} recovered OOM(s), batch size "
                      f"{hook.batch_size}, {len(bundles)} bundle(s) written")
    hook.detach()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if QUICK:
        torch.set_num_threads(1)  # tiny models: extra threads only fight other processes
    with warnings.catch_warnings():
        # Show memwatch's verdicts as they come, once each, as a user's run would.
        warnings.simplefilter("always", MemWatchWarning)
        leak_demo()
        batch_size_finder_demo()
    if QUICK:
        print("(quick mode)")


if __name__ == "__main__":
    main()
