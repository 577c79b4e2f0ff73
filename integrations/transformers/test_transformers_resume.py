"""``Trainer.train(resume_from_checkpoint=...)`` keeps memwatch's epoch summaries: a leak that
began before the restart is confirmed at the first epoch end after it."""

from __future__ import annotations

import gc
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hf_helpers import Tokens, make_args, malloc_trim, tiny_bert
from transformers import Trainer, TrainerCallback

from memwatch import MemWatchWarning
from memwatch.integrations.transformers import STATE_FILE, MemWatchCallback

# The planted leak stands for one in a long run: the run says it is planned for this many
# steps, where a few hundred KiB per step can kill it (severity by consequence: in the few
# hundred steps this run really has, the same growth is information).
LONG_RUN = 10_000_000


STEPS = 48  # optimizer steps per epoch (batch 8), as in the Lightning resume test
KIB_PER_STEP = 512


class CachingTrainer(Trainer):
    """Keeps a growing cache that the user saves with every checkpoint and loads on resume: a
    replay buffer or an "all predictions" list, the kind of leak a restart does not cure."""

    def __init__(self, *a: Any, cache: list[torch.Tensor] | None = None, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.cache: list[torch.Tensor] = list(cache or [])

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        self.cache.append(torch.randn(KIB_PER_STEP * 256))  # 512 KiB of float32
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class _ReturnLoadBuffers(TrainerCallback):
    """At the start of training (the checkpoint is loaded by then): what loading freed goes back
    to the kernel, as in a fresh process whose load is long done. Otherwise the epoch's first
    steps refill it without RSS moving, and the epoch looks like one step (seen in a full
    suite run)."""

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        gc.collect()
        malloc_trim()


def _trainer(tmp_path: Path, cb: MemWatchCallback, epochs: int,
             cache: list[torch.Tensor] | None = None) -> CachingTrainer:
    args = make_args(tmp_path, num_train_epochs=epochs, save_strategy="epoch",
                     logging_steps=1000)
    return CachingTrainer(tiny_bert(), args, train_dataset=Tokens(8 * STEPS),
                          callbacks=[_ReturnLoadBuffers(), cb], cache=cache)


def _first_run(tmp_path: Path) -> tuple[MemWatchCallback, Path]:
    """One epoch of the leak, checkpointed at its end; then the job is "preempted"."""
    cb = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    t1 = _trainer(tmp_path, cb, epochs=1)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", MemWatchWarning)
        t1.train()
    ckpt = tmp_path / "out" / f"checkpoint-{STEPS}"
    torch.save(t1.cache, ckpt / "cache.pt")  # the user's own state, saved with the checkpoint
    del t1
    # A restart is a new process: run 1's objects are gone and their memory is returned.
    gc.collect()
    malloc_trim()
    return cb, ckpt


def _resume(tmp_path: Path, ckpt: Path) -> tuple[MemWatchCallback, list[str]]:
    cb = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    cache = torch.load(ckpt / "cache.pt", weights_only=True)
    t2 = _trainer(tmp_path, cb, epochs=2, cache=cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MemWatchWarning)
        t2.train(resume_from_checkpoint=str(ckpt))
    assert len(t2.cache) == 2 * STEPS  # the cache came back and kept growing
    return cb, [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)]


def test_resumed_trainer_confirms_the_leak_at_its_first_epoch_end(
        tmp_path: Path, check_resumed: Callable[..., None]) -> None:
    cb1, ckpt = _first_run(tmp_path)
    assert cb1.memwatch is not None
    before = cb1.memwatch.epochs[0]
    assert not [f for f in cb1.findings if f.kind == "leak"]  # one epoch cannot confirm a leak
    saved = json.loads((ckpt / STATE_FILE).read_text())  # strict JSON, plain data
    assert saved["train"]["step_count"] == STEPS and len(saved["train"]["epochs"]) == 1

    cb2, texts = _resume(tmp_path, ckpt)
    check_resumed(cb2.memwatch, before, STEPS, cb1.findings, cb2.findings, texts)
    rows = [r for r in cb2.trainer.state.log_history if "memwatch/findings/leak" in r]
    assert rows and rows[-1]["step"] == 2 * STEPS


def test_the_same_resume_without_memwatch_state_cannot_confirm_it_yet(tmp_path: Path) -> None:
    _, ckpt = _first_run(tmp_path)
    shutil.move(ckpt / STATE_FILE, tmp_path / "kept.json")
    cb, _ = _resume(tmp_path, ckpt)
    mw = cb.memwatch
    assert mw is not None
    assert [e.epoch for e in mw.epochs] == [0] and mw.step_count == STEPS  # a fresh session
    assert not [f for f in cb.findings if f.kind == "leak"], [f.to_dict() for f in cb.findings]
