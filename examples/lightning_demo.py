"""memwatch with PyTorch Lightning: a planted leak, the verdict, and the bundle of the crash.

The model below has the most common training leak there is: ``training_step`` keeps every loss
in ``self.history`` *with its autograd graph* (instead of ``loss.item()``), so every step's saved
activations stay alive. ``MemWatchCallback`` samples memory at every optimizer step, and at each
epoch end says whether memory is leaking, how fast, when it runs out, and what holds it.

To make the story end the way it does on a real GPU, in seconds instead of hours, the demo caps
this process's address space (``RLIMIT_AS``, Linux) once training starts: the leak then ends in a
real out-of-memory error, and the callback's ``on_exception`` leaves a flight-recorder bundle.
``--no-oom`` trains three epochs and stops instead.

Metrics go through the trainer's loggers: a ``CSVLogger`` always, and a ``WandbLogger`` in
offline mode when ``wandb`` is installed (nothing leaves the machine).

    python examples/lightning_demo.py                # leak -> verdict -> OOM -> bundle
    python examples/lightning_demo.py --no-oom       # leak -> verdict

At the end it prints the commands that show the bundle (``memwatch inspect``, ``memwatch
report``), spelled so that they run as printed: ``.venv/bin/memwatch`` after ``make demo`` (the
environment is not activated, so ``memwatch`` alone is not on ``PATH``).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memwatch.core.units import fmt_bytes, fmt_duration
from memwatch.integrations.lightning import MemWatchCallback, MemWatchWarning
from memwatch.report.text import shorten
from memwatch.runtime.announce import cli_line


class LeakyRegressor(L.LightningModule):
    def __init__(self, width: int, leak_from_epoch: int = 1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 1))
        self.leak_from_epoch = leak_from_epoch
        self.history: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        if self.current_epoch >= self.leak_from_epoch:
            self.history.append(loss)  # THE BUG: should be loss.item() (or loss.detach())
        self.log("train_loss", loss.detach())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class CapAddressSpace(L.Callback):
    """Stands in for a small GPU: caps the address space once the loggers are up."""

    def __init__(self, headroom_bytes: int) -> None:
        self.headroom = headroom_bytes

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        import resource

        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + self.headroom, resource.RLIM_INFINITY))
        print(f"[demo] address space capped at {fmt_bytes(vm + self.headroom)} "
              f"({fmt_bytes(self.headroom)} above what is mapped now)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("memwatch-out/lightning-demo"))
    ap.add_argument("--no-oom", action="store_true", help="stop after 3 epochs, no OOM")
    args = ap.parse_args(argv)
    oom = not args.no_oom and sys.platform.startswith("linux")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    torch.set_num_threads(1)  # a tiny model: threads only add noise on a small machine
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # keep the demo's output readable
    warnings.filterwarnings("ignore", module="lightning")  # CPU-run advice (dataloader workers)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    # Show each memwatch finding once, in full, as a user would see it in their terminal.
    warnings.simplefilter("always", MemWatchWarning)
    warnings.formatwarning = lambda msg, cat, *a, **k: f"\n[{cat.__name__}] {msg}\n"

    loggers: list[Any] = [CSVLogger(str(out), name="csv")]
    if importlib.util.find_spec("wandb") is not None:
        from lightning.pytorch.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        loggers.append(WandbLogger(project="memwatch-demo", save_dir=str(out), offline=True))

    # 256 x 4096 float32 activations: the leak keeps about 4 MiB per step.
    n, batch, width = 48 * 256, 256, 4096
    data = DataLoader(TensorDataset(torch.randn(n, 32), torch.randn(n, 1)), batch_size=batch)
    memwatch_cb = MemWatchCallback(out_dir=out / "memwatch", workers=False)
    callbacks: list[Any] = [memwatch_cb]
    if oom:
        callbacks.append(CapAddressSpace(headroom_bytes=512 << 20))
    trainer = L.Trainer(
        max_epochs=20 if oom else 3, accelerator="cpu", devices=1, callbacks=callbacks,
        logger=loggers, log_every_n_steps=8, default_root_dir=str(out),
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    print("[demo] training a model that keeps every loss with its graph (self.history) "
          "from epoch 1 on ...")
    died: BaseException | None = None
    try:
        trainer.fit(LeakyRegressor(width), data)
    except RuntimeError as e:  # the host OOM: "DefaultCPUAllocator: can't allocate memory"
        died = e

    print("\n=== memwatch findings (the latest verdict per metric) ===")
    latest: dict[tuple[str, str], Any] = {}
    for f in memwatch_cb.findings:  # the analyzer re-judges every epoch: show the newest
        latest[(f.kind, f.metric)] = f
    if not latest:
        print("(none)")
    for f in latest.values():
        rate = f"{fmt_bytes(f.bytes_per_step)}/step" if f.bytes_per_step else ""
        when = ""
        if f.steps_to_oom is not None:
            when = f", OOM in ~{f.steps_to_oom:,.0f} steps ({fmt_duration(f.seconds_to_oom)})"
        first = min(g.epoch for g in memwatch_cb.findings
                    if (g.kind, g.metric) == (f.kind, f.metric))
        print(f"{f.kind} in {f.metric} [{f.severity}], first reported at epoch {first}: "
              f"{rate}{when}")
        if f.culprit:
            print(f"    held by: {f.culprit}")
        for s in f.suggestions[:2]:
            print(f"    try: {s}")
    if died is not None:
        print(f"\n=== the run died at step {trainer.global_step} ===\n"
              f"{type(died).__name__}: {shorten(died, 160)}")
        bundle = memwatch_cb.bundle_path
        if bundle is not None:
            print(f"flight-recorder bundle: {bundle}\n"
                  f"    look inside:  {cli_line('inspect', bundle)}\n"
                  f"    as a web page: {cli_line('report', bundle, '-o', out / 'report.html')}")
        else:
            print("no bundle was written (see the log above)")
    print(f"\nCSV metrics: {Path(loggers[0].log_dir) / 'metrics.csv'}")
    if len(loggers) > 1:
        print(f"W&B run directory (offline): {Path(loggers[1].experiment.dir).parent}")
    return 0 if any(f.kind == "leak" for f in memwatch_cb.findings) else 1


if __name__ == "__main__":
    sys.exit(main())
