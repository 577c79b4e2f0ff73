"""Tiny BERTs, synthetic data and trainer factories for the transformers suites (CPU, seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

from memwatch.testing import malloc_trim  # noqa: F401 - the tests import it from here

SEQ = 64


def tiny_bert(hidden_states: bool = False) -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, vocab_size=100, max_position_embeddings=SEQ,
                     output_hidden_states=hidden_states)
    return BertForSequenceClassification(cfg)


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences with binary labels (fixed seed)."""

    def __init__(self, n: int, seq: int = SEQ) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 100, (n, seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class MaskedTokens(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences for a masked-LM, each its own label (fixed seed)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_args(tmp_path: Path, **kw: Any) -> TrainingArguments:
    opts: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, num_train_epochs=3, report_to=[], save_strategy="no",
        disable_tqdm=True, logging_steps=10, dataloader_num_workers=0, seed=0,
    )
    opts.update(kw)
    return TrainingArguments(**opts)


class LeakyTrainer(Trainer):
    """The classic leak in a custom ``compute_loss``: model outputs kept with their graph.

    From ``leak_from_epoch`` on, every step appends the hidden states (with ``grad_fn``) to
    ``self.kept_outputs``: 3 x 8 x 64 x 32 float32 = 192 KiB per step that is never released.
    """

    def __init__(self, *a: Any, leak_from_epoch: int | None = None, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.leak_from_epoch = leak_from_epoch
        self.kept_outputs: list[Any] = []

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        outputs = model(**inputs)
        epoch = self.state.epoch or 0.0
        if self.leak_from_epoch is not None and int(epoch) >= self.leak_from_epoch:
            self.kept_outputs.append(outputs.hidden_states)  # the planted bug
        loss = outputs.loss
        return (loss, outputs) if return_outputs else loss



class DeviceHungryTrainer(Trainer):
    """Each step allocates ``bytes_per_sample x batch`` on a :class:`memwatch.testing.FakeDevice`
    for its activations, then frees them: a batch too big for the device raises
    ``torch.OutOfMemoryError`` from inside the allocation, after the OOM observers ran (what a
    CUDA run does), which is what ``auto_find_batch_size`` catches."""

    def __init__(self, *a: Any, device: Any, bytes_per_sample: int, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.fake_device = device
        self.bytes_per_sample = bytes_per_sample
        self.batch_sizes: list[int] = []

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        n = int(inputs["input_ids"].shape[0])
        self.batch_sizes.append(n)
        h = self.fake_device.malloc(n * self.bytes_per_sample)
        try:
            outputs = model(**inputs)
        finally:
            self.fake_device.free(h)
        return (outputs.loss, outputs) if return_outputs else outputs.loss


class EvalLeakTrainer(Trainer):
    """The classic evaluation leak: every evaluation step's outputs are kept "for later metrics"
    in ``self.all_hidden`` and never cleared (192 KiB per evaluation step at batch 8), from the
    second evaluation on."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.all_hidden: list[Any] = []
        self.evaluations = 0

    def evaluate(self, *a: Any, **kw: Any) -> Any:
        self.evaluations += 1
        return super().evaluate(*a, **kw)

    def prediction_step(self, model: Any, inputs: Any, prediction_loss_only: bool,
                        ignore_keys: Any = None) -> Any:
        with torch.no_grad():
            outputs = model(**inputs)
        if self.evaluations >= 2:
            self.all_hidden.append(outputs.hidden_states)  # the planted bug
        return outputs.loss.detach(), None, None
