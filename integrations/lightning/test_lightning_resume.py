"""Checkpoints keep memwatch's epoch summaries: a leak spanning a restart is still seen."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning_helpers import CachingRegressor, loader, make_trainer, malloc_trim

from memwatch.integrations.lightning import MemWatchCallback, MemWatchWarning

# The planted leak stands for one in a long run: the run says it is planned for this many
# steps, where a few hundred KiB per step can kill it (severity by consequence: in the few
# hundred steps this run really has, the same growth is information).
LONG_RUN = 10_000_000


def test_resume_keeps_epoch_summaries_and_sees_the_leak(
        tmp_path: Path, judged: Callable[[Any, str], list[tuple[Any, ...]]]) -> None:
    # Run 1: one epoch of a cache that grows 512 KiB a step and is saved with the checkpoint;
    # then the job is "preempted": checkpoint, new trainer, new model object.
    cb1 = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    model1 = CachingRegressor(width=64)
    t1 = make_trainer(tmp_path / "run1", [cb1], max_epochs=1, limit_val_batches=0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", MemWatchWarning)
        t1.fit(model1, loader(48))
    ckpt = tmp_path / "preempted.ckpt"
    t1.save_checkpoint(ckpt)
    assert cb1.memwatch is not None
    before = cb1.memwatch.epochs[0]
    assert not [f for f in cb1.findings if f.kind == "leak"]  # one epoch cannot confirm a leak
    del model1, t1
    # A restart is a new process: run 1's objects are gone and their memory is returned.
    gc.collect()
    malloc_trim()

    # The callback's state is plain data: the strictest loader accepts it.
    raw = torch.load(ckpt, weights_only=True)
    states = [v for k, v in raw["callbacks"].items() if "MemWatchCallback" in k]
    assert len(states) == 1 and len(states[0]["train"]["epochs"]) == 1

    # Run 2: resume; the cache comes back with the checkpoint and keeps growing.
    cb2 = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    t2 = make_trainer(tmp_path / "run2", [cb2], max_epochs=2, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MemWatchWarning)
        t2.fit(CachingRegressor(width=64), loader(48), ckpt_path=str(ckpt))
    mw = cb2.memwatch
    assert mw is not None and mw.timeline is not None
    assert [e.epoch for e in mw.epochs] == [0, 1]
    restored, new = mw.epochs
    assert restored.n_steps == before.n_steps == 48
    assert restored.bucket_floor is not None and before.bucket_floor is not None
    # (NaN where a metric has no value, e.g. cgroup.limit in a cgroup without one: equal too)
    assert np.array_equal(restored.bucket_floor, before.bucket_floor, equal_nan=True)
    # One step axis across the restart.
    assert new.start_step == restored.end_step + 1 and new.n_steps == 48
    assert mw.step_count == 96
    # Only one epoch ran in this process: the verdict needs the epoch from before the restart.
    leaks = [f for f in cb2.findings if f.kind == "leak"]
    col = mw.timeline.keys.index("host.rss")
    floors = [(e.epoch, e.floor[col] / 2**20, e.last[col] / 2**20) for e in mw.epochs]
    assert leaks, (floors, judged(mw, "host.rss"), [f.to_dict() for f in cb2.findings])
    assert any(issubclass(w.category, MemWatchWarning) and "leak" in str(w.message)
               for w in caught)


def test_resume_without_memwatch_state_is_harmless(tmp_path: Path) -> None:
    # A checkpoint written without the callback resumes with it: nothing to restore, no error.
    t1 = make_trainer(tmp_path / "a", [], max_epochs=1, limit_val_batches=0, logger=False)
    model = CachingRegressor(width=16, kib_per_step=1)
    t1.fit(model, loader(4, 8))
    t1.save_checkpoint(tmp_path / "plain.ckpt")
    cb = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    t2 = make_trainer(tmp_path / "b", [cb], max_epochs=2, limit_val_batches=0, logger=False)
    t2.fit(CachingRegressor(width=16, kib_per_step=1), loader(4, 8),
           ckpt_path=str(tmp_path / "plain.ckpt"))
    assert cb.memwatch is not None and len(cb.memwatch.epochs) == 1
