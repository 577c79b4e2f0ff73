"""Acceptance (1): a planted leak in a custom Accelerate loop is reported by the end of the
second epoch after it starts, with its holder named."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate_helpers import setup, train

from memwatch import MemWatchWarning
from memwatch.integrations.accelerate import attach


def test_planted_leak_reported_by_the_second_epoch_after_it_starts(tmp_path: Path) -> None:
    # Epoch 0 is clean (warm-up); the leak starts in epoch 1; epoch 2 is the second leaking
    # epoch: the verdict must be there when the loop ends. Each leaking step keeps hidden
    # activations with their graph: 128 x 2048 float32, 1 MiB.
    acc, model, opt, data = setup(n_batches=48, batch_size=128, width=2048)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path))
    with pytest.warns(MemWatchWarning) as caught:
        train(acc, model, opt, data, epochs=3, leak_from_epoch=1)
    assert len(model.history) == 96  # the bug really ran: 2 epochs x 48 steps of kept activations
    assert hook.memwatch.epoch == 3  # the epochs ended by themselves (loader exhausted)

    leaks = [f for f in hook.findings if f.kind == "leak"]
    assert leaks, [f.to_dict() for f in hook.findings]
    assert all(f.severity in ("warning", "critical") for f in leaks)
    assert all(f.bytes_per_step is not None and f.bytes_per_step > 100 * 1024 for f in leaks)
    named = [f for f in leaks if f.culprit and "history" in f.culprit]
    assert named, [f.to_dict() for f in leaks]

    texts = [str(w.message) for w in caught if issubclass(w.category, MemWatchWarning)]
    leak_texts = [t for t in texts if "leak in host" in t or "leak in device" in t]
    # Once per finding, not once per epoch: one warning, plus one more when the holder is found.
    assert 1 <= len(leak_texts) <= 2, texts
    assert "history" in leak_texts[-1]
    hook.detach()
