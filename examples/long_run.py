"""One long epoch, four ways: verdicts inside the epoch, at checks every N steps.

LLM pre-training and fine-tuning runs have one epoch or none: ``max_steps`` on a streaming
dataset, Lightning's ``val_check_interval``, an Accelerate loop that breaks when it is done.
memwatch judges them at *checks* every ``check_every_n_steps`` optimizer steps (default 5,000)
or ``check_every_s`` seconds (default 600). Here each of the four runs is the first 600 steps of
a run planned for 200,000, with a check every 150 steps and the same planted leak: the training
code keeps a 256 KiB tensor every step in a list it owns. The leak is found inside the epoch, at
the second check after it starts, and named.

    python examples/long_run.py                      # plain, lightning, transformers, accelerate
    python examples/long_run.py lightning            # one of them
"""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import memwatch
from memwatch import MemWatchWarning

STEPS = 600  # the steps this example runs: the first 600 ...
PLANNED = 200_000  # ... of a run planned for this many
EVERY = 150  # a check every 150 steps (the default is 5,000: this run is short)
KEPT_FLOATS = 65_536  # the planted leak: a float32[65536] (256 KiB) kept per step


class Stream(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """A streaming dataset (no length: no epoch ends)."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(0)
        while True:
            yield {"x": torch.randn(8, generator=g), "labels": torch.randn((), generator=g)}


def report(name: str, findings: list[memwatch.Finding], caught: list[Any]) -> None:
    print(f"== {name}")
    for f in findings:
        if f.kind == "leak":
            print(f"check {f.check} at step {f.step}: {f.kind} in {f.metric} ({f.severity})")
            print(f"  held by: {f.culprit}")
    for w in caught:
        if issubclass(w.category, MemWatchWarning):
            # The warning's first line says it all (kind, metric, holder, rate, forecast).
            print(f"  warning: {str(w.message).splitlines()[0]}")
            print(f"    (at {Path(w.filename).name}:{w.lineno})")
    print()


def plain(out: Path) -> list[memwatch.Finding]:
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept: list[torch.Tensor] = []
    with memwatch.watch(device="cpu", workers=False, out_dir=out, check_every_n_steps=EVERY,
                        total_steps=PLANNED) as mw:
        for step, batch in enumerate(torch.utils.data.DataLoader(Stream(), batch_size=4)):
            loss = (model(batch["x"]).squeeze(-1) - batch["labels"]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(torch.ones(KEPT_FLOATS))  # the planted leak
            mw.step()  # no end_epoch(): there is no epoch
            if step + 1 == STEPS:
                break
    return list(mw.findings)


def lightning(out: Path) -> list[memwatch.Finding]:
    import lightning.pytorch as L

    from memwatch.integrations.lightning import MemWatchCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 1)
            self.kept: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.kept.append(torch.ones(KEPT_FLOATS))  # the planted leak
            if self.global_step + 1 >= STEPS:
                self.trainer.should_stop = True  # this example stops early
            return (self.layer(batch["x"]).squeeze(-1) - batch["labels"]).pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.layer(batch["x"])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    cb = MemWatchCallback(workers=False, out_dir=str(out), check_every_n_steps=EVERY)
    trainer = L.Trainer(max_steps=PLANNED, val_check_interval=EVERY, limit_val_batches=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(out), callbacks=[cb])
    loader = torch.utils.data.DataLoader(Stream(), batch_size=4)
    trainer.fit(Tiny(), loader, torch.utils.data.DataLoader(Stream(), batch_size=4))
    return cb.findings


def transformers(out: Path) -> list[memwatch.Finding]:
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from memwatch.integrations.transformers import MemWatchCallback

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 1)
            self.kept: list[torch.Tensor] = []

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            if self.training:
                self.kept.append(torch.ones(KEPT_FLOATS))  # the planted leak
            return {"loss": (self.layer(x).squeeze(-1) - labels).pow(2).mean()}

    class StopEarly(TrainerCallback):  # this example stops early
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step >= STEPS:
                control.should_training_stop = True

    cb = MemWatchCallback(workers=False, out_dir=str(out), check_every_n_steps=EVERY)
    args = TrainingArguments(str(out), use_cpu=True, max_steps=PLANNED, report_to=[],
                             per_device_train_batch_size=4, save_strategy="no",
                             disable_tqdm=True, logging_steps=10**9, dataloader_num_workers=0)
    trainer = Trainer(Tiny(), args, train_dataset=Stream(), callbacks=[cb, StopEarly()])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return cb.findings


def accelerate(out: Path) -> list[memwatch.Finding]:
    from accelerate import Accelerator

    from memwatch.integrations.accelerate import attach

    acc = Accelerator(cpu=True)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt,
                                     torch.utils.data.DataLoader(Stream(), batch_size=4))
    kept: list[torch.Tensor] = []
    with attach(acc, opt, workers=False, out_dir=str(out), check_every_n_steps=EVERY,
                total_steps=PLANNED) as hook:
        for step, batch in enumerate(loader):
            acc.backward((model(batch["x"]).squeeze(-1) - batch["labels"]).pow(2).mean())
            opt.step()
            opt.zero_grad()
            kept.append(torch.ones(KEPT_FLOATS))  # the planted leak
            if step + 1 == STEPS:
                break
    return hook.findings


RUNS = {"plain": ("a plain loop that only calls mw.step()", plain),
        "lightning": ("Lightning: max_steps, val_check_interval, a streaming loader", lightning),
        "transformers": ("transformers Trainer: max_steps, an IterableDataset", transformers),
        "accelerate": ("Accelerate: a loop with no epoch", accelerate)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", metavar="RUN",
                    help=f"which runs ({', '.join(RUNS)}; default all)")
    ap.add_argument("--out", default="memwatch-long-run", help="output folder")
    args = ap.parse_args()
    for name in args.runs:
        if name not in RUNS:
            ap.error(f"unknown run {name!r}: choose from {', '.join(RUNS)}")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    for name in args.runs or list(RUNS):
        title, run = RUNS[name]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            findings = run(Path(args.out) / name)
        report(f"{title} ({STEPS} of {PLANNED:,} steps, a check every {EVERY})", findings,
               caught)


if __name__ == "__main__":
    main()
