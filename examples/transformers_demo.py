"""memwatch with the Hugging Face ``Trainer``: a planted leak, its verdict, and a batch-size finder.

Part 1 — a leak. The ``Trainer`` subclass below has a classic bug in its custom ``compute_loss``:
it keeps every step's model outputs (hidden states *with their autograd graph*) in
``self.kept_outputs``, e.g. "to look at them later". ``MemWatchCallback`` samples memory at every
optimizer step and, at each epoch end, says whether memory is leaking, how fast, and what holds it.
Its keys go into ``trainer.state.log_history`` and every ``report_to`` integration (W&B offline
here when ``wandb`` is installed: nothing leaves the machine).

Part 2 — ``auto_find_batch_size=True``. A simulated 110 MiB accelerator
(:class:`memwatch.testing.FakeDevice`) stands in for a small GPU: each step needs 8 MiB per sample
there, so batches of 16 and 14 run out of memory and Accelerate retries with a smaller batch.
memwatch records those OOMs as *recovered* (no bundle storm) and reports the batch that fit.

The whole ``train()`` runs inside :func:`memwatch.integrations.transformers.watch_trainer`, so any
exception out of it would leave a flight-recorder bundle.

    python examples/transformers_demo.py
    MEMWATCH_EXAMPLE_QUICK=1 python examples/transformers_demo.py   # the test suite's short run
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs: nothing to fetch

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from memwatch import MemWatchWarning
from memwatch.core.units import fmt_bytes
from memwatch.integrations.transformers import MemWatchCallback, watch_trainer
from memwatch.testing import FakeDevice

MIB = 1 << 20


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, seq: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 100, (n, seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        vocab_size=100, max_position_embeddings=64, output_hidden_states=True))


class LeakyTrainer(Trainer):
    kept_outputs: list[Any] = []

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        outputs = model(**inputs)
        if (self.state.epoch or 0) >= 1:  # the first epoch is clean: warm-up is not a leak
            self.kept_outputs.append(outputs.hidden_states)  # THE BUG: keeps graphs alive
        return (outputs.loss, outputs) if return_outputs else outputs.loss


class HungryTrainer(Trainer):
    """Each step needs 8 MiB per sample on the simulated accelerator (activations)."""

    device_sim = FakeDevice(total_bytes=110 * MIB)

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        h = self.device_sim.malloc(int(inputs["input_ids"].shape[0]) * 8 * MIB)
        try:
            outputs = model(**inputs)
        finally:
            self.device_sim.free(h)
        return (outputs.loss, outputs) if return_outputs else outputs.loss


def args_for(out: Path, **kw: Any) -> TrainingArguments:
    opts: dict[str, Any] = dict(output_dir=str(out), use_cpu=True, per_device_train_batch_size=8,
                                num_train_epochs=3, save_strategy="no", disable_tqdm=True,
                                logging_steps=20, report_to=[], seed=0)
    opts.update(kw)
    return TrainingArguments(**opts)


def part1_leak(out: Path, steps_per_epoch: int) -> None:
    print("== part 1: a leak in compute_loss ==")
    report_to = ["wandb"] if importlib.util.find_spec("wandb") else []
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_DIR", str(out))
    os.environ.setdefault("WANDB_SILENT", "true")
    cb = MemWatchCallback(workers=False)
    trainer = LeakyTrainer(tiny_bert(), args_for(out / "leak", report_to=report_to),
                           train_dataset=Tokens(8 * steps_per_epoch), callbacks=[cb])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MemWatchWarning)
        with watch_trainer(trainer):
            trainer.train()
    if report_to:
        import wandb

        wandb.finish()
    for w in caught:
        if issubclass(w.category, MemWatchWarning):
            print(f"[warning] {w.message}")
    for f in cb.findings:
        if f.kind == "leak":
            rate = fmt_bytes(f.bytes_per_step) if f.bytes_per_step else "?"
            print(f"verdict: {f.kind} in {f.metric}, {rate}/step, held by {f.culprit}")
    keys = sorted({k for row in trainer.state.log_history for k in row
                   if k.startswith("memwatch/")})
    print(f"memwatch keys in log_history: {', '.join(keys[:6])} ... ({len(keys)} in all)")
    print(f"kept outputs: {len(trainer.kept_outputs)} (the bug ran)")


def part2_batch_finder(out: Path) -> None:
    print("\n== part 2: auto_find_batch_size on a 110 MiB (simulated) accelerator ==")
    cb = MemWatchCallback(workers=False, device=HungryTrainer.device_sim)
    trainer = HungryTrainer(tiny_bert(), args_for(out / "finder", auto_find_batch_size=True,
                                                  per_device_train_batch_size=16,
                                                  num_train_epochs=1),
                            train_dataset=Tokens(48), callbacks=[cb])
    with watch_trainer(trainer):
        trainer.train()
    for e in cb.recovered_ooms:
        print(f"recovered OOM: batch {e['batch_size']} tried to allocate "
              f"{fmt_bytes(e['tried_to_allocate'] or 0)}; no bundle written")
    print(f"training finished with batch size {cb.train_batch_size}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("memwatch-out/transformers-demo"))
    ap.add_argument("--steps-per-epoch", type=int, default=None)
    a = ap.parse_args(argv)
    quick = bool(os.environ.get("MEMWATCH_EXAMPLE_QUICK"))
    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.set_num_threads(1)
    part1_leak(a.out, a.steps_per_epoch or (40 if quick else 80))
    part2_batch_finder(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
