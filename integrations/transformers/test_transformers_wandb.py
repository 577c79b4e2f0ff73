"""Acceptance (4): memwatch keys reach ``trainer.state.log_history`` and a real offline W&B run
(``report_to="wandb"``), read back from the run directory.

The ordering problem this guards against: ``Trainer.log`` stores a copy of the row and then calls
``on_log`` on the reporting callbacks *before* user callbacks. The callback moves itself in front
of them and logs findings through ``trainer.log``; without that, neither place sees the keys.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hf_helpers import LeakyTrainer, Tokens, make_args, tiny_bert
from transformers.integrations import WandbCallback

from memwatch.integrations.transformers import MemWatchCallback

wandb = pytest.importorskip("wandb")


def _wandb_log(run_dir: Path, needles: tuple[bytes, ...]) -> bytes:
    # The offline writer is a separate process that may still be flushing after finish().
    deadline = time.monotonic() + 30
    data = b""
    while time.monotonic() < deadline:
        logs = list(run_dir.glob("*.wandb"))
        data = logs[0].read_bytes() if logs else b""
        if all(n in data for n in needles):
            break
        time.sleep(0.2)
    return data


def test_keys_reach_log_history_and_an_offline_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "memwatch-test")
    cb = MemWatchCallback(workers=False)
    args = make_args(tmp_path, report_to=["wandb"], num_train_epochs=2, logging_steps=4,
                     eval_strategy="epoch", run_name="memwatch-hf")
    # The user's usual spelling: the callback listed in callbacks=[...], i.e. after W&B's.
    trainer = LeakyTrainer(tiny_bert(), args, train_dataset=Tokens(64), eval_dataset=Tokens(16),
                           callbacks=[cb])
    names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert names.index("MemWatchCallback") < names.index("WandbCallback"), names
    trainer.train()
    run = wandb.run
    assert run is not None
    run_dir = Path(run.dir).parent
    wandb.finish()

    hist = trainer.state.log_history
    loss_rows = [r for r in hist if "loss" in r]
    assert loss_rows and all(r["memwatch/host.rss_gib"] > 0 for r in loss_rows), hist
    assert sum("memwatch/findings/count" in r for r in hist) == 2  # one per epoch end
    assert any("memwatch/val/host.rss.peak_gib" in r for r in hist)
    # W&B gets memwatch's keys from memwatch's W&B sink, under memwatch/ (W&B's callback, which
    # prefixes non-eval keys with "train/", gets the rows without them).
    from memwatch.testing.wandb_offline import read_offline_run

    keys = {k for r in read_offline_run(run_dir).history for k in r}
    assert {"memwatch/host.rss_gib", "memwatch/val/host.rss_gib", "train/loss"} <= keys, keys
    assert not [k for k in keys if k.startswith("train/memwatch")], sorted(keys)


def test_without_the_ordering_wandb_would_miss_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: a callback that only adds keys in ``on_log`` after W&B's loses them."""
    from transformers import TrainerCallback

    class NaiveCallback(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):  # type: ignore[no-untyped-def]
            logs["naive/marker"] = 1.0

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    args = make_args(tmp_path, report_to=["wandb"], num_train_epochs=1, logging_steps=4,
                     run_name="control")
    trainer = LeakyTrainer(tiny_bert(), args, train_dataset=Tokens(32), callbacks=[NaiveCallback])
    assert isinstance(trainer.callback_handler.callbacks[1], WandbCallback)
    trainer.train()
    run_dir = Path(wandb.run.dir).parent  # type: ignore[union-attr]
    wandb.finish()
    assert not any("naive/marker" in r for r in trainer.state.log_history)
    data = _wandb_log(run_dir, (b"train/loss",))
    # History keys carry W&B's "train/" prefix (the console log captured in the same file shows
    # the row as printed, marker included: that is not the run's history).
    assert b"train/loss" in data and b"train/naive/marker" not in data
