"""Two reported shapes of a transformers leak whose holder is the user's, in a real ``Trainer``
run of a tiny masked-LM built from a config (CPU, nothing downloaded):

* ``metrics``: a ``compute_metrics`` that keeps ``p.predictions`` (numpy arrays the trainer made
  with ``tensor.numpy()``) in a module list, ``EVAL_LOGITS``, at every evaluation;
* ``loss``: a ``compute_loss`` that keeps ``outputs.logits`` (with their graphs) in
  ``self.train_logits`` at every step.

Run as a script it trains with ``MemWatchCallback`` when given ``--callback OUT_JSON`` (and
writes the findings there), or bare, for ``memwatch run`` to watch.

    python hf_holder_runs.py metrics --callback findings.json
    memwatch run -- python hf_holder_runs.py loss
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

import torch
from hf_helpers import MaskedTokens
from transformers import BertConfig, BertForMaskedLM, PrinterCallback, Trainer, TrainingArguments

SEQ, VOCAB = 32, 1000
EVAL_LOGITS: list[Any] = []  # metrics: every evaluation's predictions (the bug)




def compute_metrics(p: Any) -> dict[str, float]:
    EVAL_LOGITS.append(p.predictions)  # the bug: 256 x 32 x 1000 float32 (31 MiB) each time
    return {"evaluations": float(len(EVAL_LOGITS))}


class LogitsTrainer(Trainer):
    """Keeps every step's logits "for a later metric" (the bug)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.train_logits: list[torch.Tensor] = []

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        outputs = model(**inputs)
        self.train_logits.append(outputs.logits)  # 8 x 32 x 1000 float32 (1 MiB) per step
        return (outputs.loss, outputs) if return_outputs else outputs.loss


def train(mode: str, epochs: int, callbacks: list[Any]) -> Trainer:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=SEQ)
    metrics = mode == "metrics"
    args = TrainingArguments(tempfile.mkdtemp(), use_cpu=True, per_device_train_batch_size=8,
                             per_device_eval_batch_size=64, num_train_epochs=epochs,
                             report_to=[], save_strategy="no", disable_tqdm=True,
                             logging_steps=1000, eval_strategy="epoch" if metrics else "no",
                             seed=0, dataloader_num_workers=0)
    cls = Trainer if metrics else LogitsTrainer
    trainer = cls(BertForMaskedLM(cfg), args, train_dataset=MaskedTokens(8 * 24, SEQ, VOCAB),
                  eval_dataset=MaskedTokens(256, SEQ, VOCAB) if metrics else None,
                  callbacks=callbacks,
                  compute_metrics=compute_metrics if metrics else None)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("metrics", "loss"))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--callback", help="watch with MemWatchCallback; findings to this file")
    args = ap.parse_args()
    if args.callback is None:
        train(args.mode, args.epochs, [])
        return
    from memwatch.integrations.transformers import MemWatchCallback

    # A run planned long: the leak can kill it (a warning), as in the reports.
    cb = MemWatchCallback(workers=False, total_steps=10_000_000)
    train(args.mode, args.epochs, [cb])
    with open(args.callback, "w") as f:
        json.dump([x.to_dict() for x in cb.findings], f)


if __name__ == "__main__":
    main()
