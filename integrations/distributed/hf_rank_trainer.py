"""A real transformers ``Trainer`` (tiny BERT from a config, CPU, gloo) under ``torchrun`` with
memwatch's ``MemWatchCallback``; only rank 1 leaks. Launched by test_hf_torchrun.py:

    python -m torch.distributed.run --nproc_per_node=2 hf_rank_trainer.py OUT_DIR

Each rank writes ``OUT_DIR/report-rank<r>.json``: its findings, its ``trainer.state.log_history``,
the per-rank summaries (rank 0), the MemWatchWarnings it emitted and how much the bug kept.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import PrinterCallback, Trainer, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "transformers"))
from hf_helpers import SEQ, Tokens, tiny_bert  # noqa: E402

from memwatch import MemWatchWarning  # noqa: E402
from memwatch.integrations.transformers import MemWatchCallback  # noqa: E402

# The planted leak stands for one in a long run: the run says it is planned for this many
# steps, where a few hundred KiB per step can kill it (severity by consequence: in the few
# hundred steps this run really has, the same growth is information).
LONG_RUN = 10_000_000


EPOCHS = 4  # a leak is due by the end of the second epoch after it starts (epoch 0), + 1 margin
STEPS = 80  # optimizer steps per epoch and rank (batch 8, two shards)
BATCH = 8
HIDDEN = 32  # tiny_bert's hidden size: one kept hidden state is BATCH x SEQ x HIDDEN float32


class RankOneKeepsHiddenStates(Trainer):
    """Rank-dependent debugging code left in ``compute_loss``: rank 1 keeps the last hidden state of
    every batch (8 x 64 x 32 float32 = 64 KiB per step, detached, never released)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.rank1_hidden: list[torch.Tensor] = []

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        outputs = model(**inputs)
        if self.args.process_index == 1:
            self.rank1_hidden.append(outputs.hidden_states[-1].detach().clone())  # the bug
        return (outputs.loss, outputs) if return_outputs else outputs.loss


def main() -> None:
    out_dir = Path(sys.argv[1])
    torch.set_num_threads(1)
    # use_cpu + ddp_backend="gloo": transformers hands both to Accelerate's PartialState, which
    # initialises torch.distributed from torchrun's env (MULTI_CPU on gloo).
    args = TrainingArguments(
        output_dir=str(out_dir / "out"), use_cpu=True, ddp_backend="gloo",
        ddp_find_unused_parameters=False, per_device_train_batch_size=BATCH,
        num_train_epochs=EPOCHS, report_to=[], save_strategy="no", disable_tqdm=True,
        logging_steps=STEPS // 2, dataloader_num_workers=0, seed=0)
    cb = MemWatchCallback(workers=False, signals=False, total_steps=LONG_RUN)
    # 2 x 8 x 80 samples: the trainer's DistributedSampler gives each rank 80 batches of 8.
    trainer = RankOneKeepsHiddenStates(tiny_bert(hidden_states=True), args,
                           train_dataset=Tokens(2 * BATCH * STEPS), callbacks=[cb])
    trainer.remove_callback(PrinterCallback)
    rank = args.process_index
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MemWatchWarning)
        trainer.train()
    train_s = time.perf_counter() - t0
    mw = cb.memwatch
    report = {
        "rank": rank,
        "world_size": args.world_size,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "train_s": train_s,
        "steps": None if mw is None else mw.step_count,
        "epochs": None if mw is None else len(mw.epochs),
        "out_dir": None if mw is None else str(mw.out_dir),
        "kept_bytes": sum(t.numel() * t.element_size() for t in trainer.rank1_hidden),
        "bytes_per_kept": BATCH * SEQ * HIDDEN * 4,
        "findings": [f.to_dict() for f in cb.findings],
        "rank_summaries": [] if mw is None else mw.rank_summaries,
        "log_history": trainer.state.log_history,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)],
    }
    (out_dir / f"report-rank{rank}.json").write_text(json.dumps(report, default=str))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
