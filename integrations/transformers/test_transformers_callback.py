"""The callback's contract beyond the acceptance suites: configuration errors, the watchdog's stop
mapped to ``control.should_save``/``should_training_stop``, gradient accumulation, and a callback
added after the trainer was built."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_helpers import LeakyTrainer, Tokens, make_args, tiny_bert
from transformers import TrainerCallback

from memwatch import ConfigError, MemWatchWarning
from memwatch.integrations.transformers import MemWatchCallback
from memwatch.testing import FakeDevice


@pytest.mark.parametrize("kwargs, fragment", [
    ({"log_every_n_steps": 0}, "log_every_n_steps=0"),
    ({"recovered_oom": "loud"}, "recovered_oom='loud'"),
    ({"not_an_option": 1}, "not_an_option"),
])
def test_bad_configuration_fails_at_construction(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        MemWatchCallback(**kwargs)  # type: ignore[arg-type]


class _FillDevice(TrainerCallback):
    def __init__(self, dev: FakeDevice, at_step: int) -> None:
        self.dev, self.at_step = dev, at_step

    def on_step_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        if state.global_step + 1 >= self.at_step:
            self.dev.set(allocated=int(self.dev.total * 0.97))  # past the critical threshold


def test_watchdog_stop_saves_a_checkpoint_and_stops(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=1 << 30)
    cb = MemWatchCallback(workers=False, device=dev, graceful_stop=True,
                          watchdog={"every_n_steps": 1, "on_critical": ("stop",),
                                    "on_warning": ()})
    trainer = LeakyTrainer(tiny_bert(), make_args(tmp_path, num_train_epochs=1),
                           train_dataset=Tokens(80), callbacks=[cb, _FillDevice(dev, 3)])
    with pytest.warns(MemWatchWarning) as caught:  # the stop, and the near-OOM finding
        trainer.train()
    assert any("stopping training" in str(w.message) for w in caught)
    assert cb.stopped_by_memwatch
    assert trainer.state.global_step == 3  # of 10
    assert (tmp_path / "out" / "checkpoint-3").is_dir()  # although save_strategy="no"


def test_gradient_accumulation_samples_optimizer_steps_and_late_add(tmp_path: Path) -> None:
    args = make_args(tmp_path, num_train_epochs=1, gradient_accumulation_steps=4,
                     per_device_train_batch_size=2, logging_steps=1)
    trainer = LeakyTrainer(tiny_bert(), args, train_dataset=Tokens(32))
    cb = MemWatchCallback(workers=False)
    trainer.add_callback(cb)  # after construction: found again at on_train_begin
    trainer.train()
    assert cb.trainer is trainer
    assert cb.memwatch is not None and cb.memwatch.step_count == 4  # 16 micro-batches / 4
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert len(rows) == 4 and all("memwatch/host.rss_gib" in r for r in rows)


class _FailOnce(LeakyTrainer):
    failed = False

    def compute_loss(self, model, inputs, return_outputs=False,  # type: ignore[no-untyped-def]
                     num_items_in_batch=None):
        if not self.failed and self.state.global_step == 2:
            self.failed = True
            raise ValueError("boom")
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def test_train_again_after_a_caught_exception_is_not_a_recovered_oom(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False, signals=False)
    trainer = _FailOnce(tiny_bert(), make_args(tmp_path, num_train_epochs=1),
                        train_dataset=Tokens(32), callbacks=[cb])
    with pytest.raises(ValueError, match="boom"):
        trainer.train()
    first = cb.memwatch
    assert first is not None and first.running  # no on_train_end after a crash
    trainer.train()
    assert not first.running and cb.memwatch is not first
    assert cb.recovered_ooms == []
    assert cb.memwatch is not None and cb.memwatch.step_count == 4


def test_log_every_n_steps_adds_rows_of_its_own(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False, log_every_n_steps=2)
    args = make_args(tmp_path, num_train_epochs=1, logging_steps=100)  # the trainer logs no loss
    trainer = LeakyTrainer(tiny_bert(), args, train_dataset=Tokens(48), callbacks=[cb])
    trainer.train()
    own = [r for r in trainer.state.log_history
           if "memwatch/host.rss_gib" in r and "loss" not in r and "train_runtime" not in r]
    assert [r["step"] for r in own] == [2, 4, 6]


def test_excepthook_chained_from_train_begin_to_train_end(tmp_path: Path) -> None:
    import sys

    seen: list[object] = []

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            seen.append(sys.excepthook)

    before = sys.excepthook
    cb = MemWatchCallback(workers=False, signals=False)
    trainer = LeakyTrainer(tiny_bert(), make_args(tmp_path, num_train_epochs=1),
                           train_dataset=Tokens(16), callbacks=[cb, Probe()])
    assert sys.excepthook is before  # nothing installed by construction
    trainer.train()
    assert seen and all(h is not before for h in seen)  # memwatch's hook during training
    assert sys.excepthook is before  # and removed at on_train_end


def test_a_check_at_a_logging_step_keeps_the_trainers_own_row(tmp_path: Path) -> None:
    """A check inside the epoch logs memwatch's findings counts through ``trainer.log`` from
    ``on_step_end``; that must not cancel the loss row the trainer logs at the same step (the
    callbacks' ``on_log`` clears ``control.should_log``)."""
    cb = MemWatchCallback(workers=False, device=FakeDevice(), check_every_n_steps=16, warn=False)
    args = make_args(tmp_path, num_train_epochs=1, logging_steps=16)  # checks on logging steps
    trainer = LeakyTrainer(tiny_bert(), args, train_dataset=Tokens(256), callbacks=[cb])
    trainer.train()
    losses = [row["step"] for row in trainer.state.log_history if "loss" in row]
    assert losses == [16, 32], trainer.state.log_history
    counts = [row["step"] for row in trainer.state.log_history
              if "memwatch/findings/count" in row and "loss" not in row]
    assert 16 in counts and 32 in counts  # memwatch's own rows are there too
