"""``accelerator.save_state()``/``load_state()`` carry memwatch's epoch summaries: a leak that
began before the restart is confirmed at the first epoch end after it."""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from accelerate_helpers import malloc_trim, reset_accelerate, setup

from memwatch import AnalyzerConfig, MemWatchWarning
from memwatch.integrations.accelerate import STATE_FILE, AccelerateHook, attach

STEPS = 48  # optimizer steps per epoch, as in the Lightning resume test
KIB_PER_STEP = 512


def _epoch(acc: Any, model: Any, opt: Any, data: Any, cache: list[torch.Tensor]) -> None:
    """One pass of a plain loop that keeps a growing cache (a replay buffer, say) which the
    user saves with every checkpoint: the kind of leak a restart does not cure."""
    for x, y in data:
        cache.append(torch.randn(KIB_PER_STEP * 256))  # 512 KiB of float32
        loss = F.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()


def _first_run(tmp_path: Path, checkpoint: str, **options: Any) -> tuple[AccelerateHook, Path]:
    acc, model, opt, data = setup(n_batches=STEPS, batch_size=16, width=64)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path / "mw1"), checkpoint=checkpoint,
                  **options)
    cache: list[torch.Tensor] = []
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", MemWatchWarning)
        _epoch(acc, model, opt, data, cache)
    assert hook.memwatch.epoch == 1  # the loader's end closed the epoch
    ckpt = tmp_path / "ckpt"
    acc.save_state(str(ckpt))
    torch.save(cache, ckpt / "cache.pt")  # the user's own state, saved with the checkpoint
    hook.detach()
    del acc, model, opt, data, cache
    # A restart is a new process: run 1's objects are gone and their memory is returned.
    reset_accelerate()
    gc.collect()
    malloc_trim()
    return hook, ckpt


def _resume(tmp_path: Path, ckpt: Path, checkpoint: str,
            **options: Any) -> tuple[AccelerateHook, list[str]]:
    acc, model, opt, data = setup(n_batches=STEPS, batch_size=16, width=64)
    # attach() before load_state(): its load pre-hook (or registration) must be in place.
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path / "mw2"), checkpoint=checkpoint,
                  **options)
    acc.load_state(str(ckpt))
    cache = torch.load(ckpt / "cache.pt", weights_only=True)
    # What loading freed (its read buffers) goes back to the kernel, as in a fresh process whose
    # load is long done: otherwise the epoch's first appends refill it without RSS moving, and
    # the epoch looks flat (seen in about 1 run in 10).
    gc.collect()
    malloc_trim()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MemWatchWarning)
        _epoch(acc, model, opt, data, cache)
    assert len(cache) == 2 * STEPS  # the cache came back and kept growing
    hook.detach()
    return hook, [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)]


@pytest.mark.parametrize("checkpoint", ["file", "register"])
def test_resumed_loop_confirms_the_leak_at_its_first_epoch_end(
        tmp_path: Path, checkpoint: str, check_resumed: Callable[..., None]) -> None:
    hook1, ckpt = _first_run(tmp_path, checkpoint)
    before = hook1.memwatch.epochs[0]
    assert not [f for f in hook1.findings if f.kind == "leak"]  # one epoch cannot confirm it
    if checkpoint == "file":
        saved = json.loads((ckpt / STATE_FILE).read_text())  # strict JSON, plain data
        assert not list(ckpt.glob("custom_checkpoint_*"))
    else:
        saved = torch.load(ckpt / "custom_checkpoint_0.pkl", weights_only=True)
        assert not (ckpt / STATE_FILE).exists()
    assert saved["train"]["step_count"] == STEPS and len(saved["train"]["epochs"]) == 1

    hook2, texts = _resume(tmp_path, ckpt, checkpoint)
    check_resumed(hook2.memwatch, before, STEPS, hook1.findings, hook2.findings, texts)


def test_a_large_heap_still_gets_the_restart_baseline_census(
        tmp_path: Path, check_resumed: Callable[..., None]) -> None:
    # A heap over census_max_objects (the default "auto" then takes a census only where growth
    # is suspected; a long pytest session is such a heap): the census at the restored epoch is
    # the baseline of the first verdict after the restart, and is taken anyway.
    big_heap = {"analyzer_config": AnalyzerConfig(census_max_objects=0)}
    hook1, ckpt = _first_run(tmp_path, "file", **big_heap)
    before = hook1.memwatch.epochs[0]
    hook2, texts = _resume(tmp_path, ckpt, "file", **big_heap)
    check_resumed(hook2.memwatch, before, STEPS, hook1.findings, hook2.findings, texts)


def test_the_same_resume_without_memwatch_state_cannot_confirm_it_yet(tmp_path: Path) -> None:
    _, ckpt = _first_run(tmp_path, "file")
    (ckpt / STATE_FILE).unlink()
    hook, _ = _resume(tmp_path, ckpt, "file")
    mw = hook.memwatch
    assert [e.epoch for e in mw.epochs] == [0] and mw.step_count == STEPS  # a fresh session
    assert not [f for f in hook.findings if f.kind == "leak"], [f.to_dict() for f in
                                                                hook.findings]
