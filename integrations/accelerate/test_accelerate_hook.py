"""Acceptance (2) and the hook's mechanics on a real ``Accelerator`` (CPU): one sample per real
optimizer step, skipped steps do not count, epoch ends from prepared DataLoaders, detach."""

from __future__ import annotations

import doctest
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from accelerate.tracking import GeneralTracker
from accelerate_helpers import loader, setup, train

import memwatch
import memwatch.integrations.accelerate as mw_acc
from memwatch.integrations.accelerate import attach


def test_gradient_accumulation_samples_once_per_optimizer_step(tmp_path: Path) -> None:
    # 22 batches, accumulation 4: steps after batches 4, 8, ..., 20, and one more at the end of
    # the loader (Accelerate syncs the last, partial window): 6 optimizer steps per epoch.
    acc, model, opt, data = setup(n_batches=22, gradient_accumulation_steps=4)
    inner_steps = 0

    def count(*_: object) -> None:
        nonlocal inner_steps
        inner_steps += 1

    counter = opt.optimizer.register_step_post_hook(count)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path))
    completed = train(acc, model, opt, data, epochs=2)
    counter.remove()
    assert completed == inner_steps == 12
    assert hook.memwatch.step_count == 12
    assert hook.memwatch.epoch == 2  # each exhausted loader pass ended one epoch
    assert [e.n_steps for e in hook.memwatch.epochs] == [6, 6]
    hook.detach()


def test_steps_a_grad_scaler_skips_do_not_count(tmp_path: Path) -> None:
    # fp16 needs a GPU in Accelerate; the same code path runs on CPU with a CPU GradScaler given
    # to the Accelerator before prepare() (AcceleratedOptimizer then steps through scaler.step).
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    acc.scaler = torch.amp.GradScaler("cpu")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path), epochs="manual")
    skipped = 0
    for i in range(10):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        acc.backward(loss)
        if i % 3 == 1:  # an overflow: the scaler finds inf gradients and skips the step
            for p in model.parameters():
                p.grad.fill_(float("inf"))
        opt.step()
        opt.zero_grad()
        skipped += int(opt.step_was_skipped)
    assert skipped == 3
    assert hook.memwatch.step_count == 10 - skipped
    hook.detach()


def test_detach_removes_every_hook_and_stops_sampling(tmp_path: Path) -> None:
    acc, model, opt, data = setup(n_batches=6)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path))
    assert len(opt.optimizer._optimizer_step_post_hooks) == 1
    assert {"begin", "end"} <= set(vars(data))
    train(acc, model, opt, data, epochs=1)
    assert hook.memwatch.step_count == 6
    hook.detach()
    assert len(opt.optimizer._optimizer_step_post_hooks) == 0
    assert len(opt.optimizer._optimizer_step_pre_hooks) == 0
    assert "begin" not in vars(data) and "end" not in vars(data)
    train(acc, model, opt, data, epochs=2)
    assert hook.memwatch.step_count == 6 and hook.memwatch.epoch == 1
    assert not hook.memwatch.running
    hook.detach()  # idempotent


def test_evaluation_loaders_do_not_end_training_epochs(tmp_path: Path) -> None:
    acc, model, opt, data = setup(n_batches=10)
    val = acc.prepare(loader(3, 16, seed=1))
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path))
    for _ in range(2):
        for i, (x, y) in enumerate(data):
            acc.backward(F.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            if i == 4:  # evaluation in the middle of an epoch, as many loops do
                with torch.no_grad():
                    for vx, vy in val:
                        F.mse_loss(model(vx), vy)
    assert hook.memwatch.step_count == 20
    assert [e.n_steps for e in hook.memwatch.epochs] == [10, 10]
    hook.detach()


def test_loaders_prepared_after_attach_and_manual_epochs(tmp_path: Path) -> None:
    acc, model, opt, _ = setup(n_batches=4)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path))
    later = acc.prepare(loader(5, 16, seed=2))  # found at the next optimizer step
    train(acc, model, opt, later, epochs=2)
    assert [e.n_steps for e in hook.memwatch.epochs] == [5, 5]
    # A loop without epochs: end_epoch() right after the pass does not end it twice.
    train(acc, model, opt, later, epochs=1)
    assert hook.end_epoch() == [] and hook.memwatch.epoch == 3
    for _ in range(3):
        acc.backward(model(torch.randn(2, 32)).sum())
        opt.step()
    hook.end_epoch()
    assert [e.n_steps for e in hook.memwatch.epochs] == [5, 5, 5, 3]
    hook.detach()


def test_attaching_again_moves_the_hook_to_the_new_optimizer(tmp_path: Path) -> None:
    acc, model, opt, data = setup(n_batches=4)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path))
    train(acc, model, opt, data, epochs=1)
    opt2 = acc.prepare(torch.optim.SGD(model.parameters(), lr=1e-3))
    assert attach(acc, opt2) is hook
    assert len(opt.optimizer._optimizer_step_post_hooks) == 0
    train(acc, model, opt2, data, epochs=1)
    assert hook.memwatch.step_count == 8 and hook.memwatch.epoch == 2
    hook.detach()
    fresh = attach(acc, opt2, workers=False, out_dir=str(tmp_path))
    assert fresh is not hook
    fresh.detach()


def test_bad_configuration_names_the_option(tmp_path: Path) -> None:
    acc, _, opt, _ = setup()
    with pytest.raises(memwatch.ConfigError, match="log_every_n_steps"):
        attach(acc, opt, log_every_n_steps=0)
    with pytest.raises(memwatch.ConfigError, match="epochs"):
        attach(acc, opt, epochs="sometimes")
    with pytest.raises(memwatch.ConfigError, match="interval_s"):
        attach(acc, opt, interval_s=-1)
    with pytest.raises(memwatch.ConfigError, match="not_an_option"):
        attach(acc, opt, not_an_option=1)
    with pytest.raises(memwatch.ConfigError, match="Accelerator"):
        attach(object(), opt)
    acc.prepare(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    with pytest.raises(memwatch.ConfigError, match="2 prepared optimizers"):
        attach(acc)


def test_a_clean_run_is_silent_and_logs_nothing_without_trackers(tmp_path: Path) -> None:
    # pytest turns warnings into errors: a clean 3-epoch run must not emit one.
    acc, model, opt, data = setup(n_batches=40, batch_size=32)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path), log_every_n_steps=5)
    train(acc, model, opt, data, epochs=3)
    assert hook.memwatch.epoch == 3
    assert not [f for f in hook.findings if f.severity in ("warning", "critical")]
    hook.detach()


def test_docstring_examples_run(tmp_path: Path) -> None:
    res = doctest.testmod(mw_acc, extraglobs={"tmp": str(tmp_path)}, optionflags=doctest.ELLIPSIS)
    assert res.attempted >= 10 and res.failed == 0, res


class ListTracker(GeneralTracker):
    """An in-memory Accelerate tracker: keeps every ``(step, values)`` it is given."""

    name = "list"
    requires_logging_directory = False

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, Any]]] = []
        self.fail = fail

    @property
    def tracker(self) -> Any:
        return self

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self.fail:
            raise OSError("disk full")
        self.rows.append((step, dict(values)))


def test_log_interval_and_step_axis(tmp_path: Path) -> None:
    tracker = ListTracker()
    acc, model, opt, data = setup(n_batches=12, log_with=[tracker])
    acc.init_trackers("t")
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path), log_every_n_steps=4)
    train(acc, model, opt, data, epochs=1)
    samples = [s for s, v in tracker.rows if "memwatch/host.rss_gib" in v]
    assert samples == [4, 8, 12]
    assert [s for s, v in tracker.rows if "memwatch/findings/count" in v] == [12]
    hook.detach()

    # The loop's own axis: a callable; or None, each tracker's own counter.
    mine = [1000]
    tracker.rows.clear()
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path), log_every_n_steps=6,
                  step=lambda: mine[0])
    train(acc, model, opt, data, epochs=1)
    assert [s for s, v in tracker.rows if "memwatch/host.rss_gib" in v] == [1000, 1000]
    hook.detach()
    tracker.rows.clear()
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path), log_every_n_steps=6, step=None)
    train(acc, model, opt, data, epochs=1)
    assert [s for s, v in tracker.rows if "memwatch/host.rss_gib" in v] == [None, None]
    hook.detach()


def test_a_failing_tracker_disables_logging_not_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acc, model, opt, data = setup(n_batches=8, log_with=[ListTracker(fail=True)])
    acc.init_trackers("t")
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path), log_every_n_steps=2)
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        train(acc, model, opt, data, epochs=2)
    assert hook.memwatch.step_count == 16 and hook.memwatch.epoch == 2  # still sampling
    failures = [r for r in caplog.records if "accelerator.log disabled" in r.getMessage()]
    assert len(failures) == 1, caplog.text  # one warning, then silence
    hook.detach()


def test_a_loader_made_by_skip_first_batches_is_watched_on_request(tmp_path: Path) -> None:
    acc, model, opt, data = setup(n_batches=8)
    hook = attach(acc, opt, workers=False, out_dir=str(tmp_path))
    resumed = acc.skip_first_batches(data, 3)  # not a prepared loader: unknown to the hook
    train(acc, model, opt, resumed, epochs=1)
    assert hook.memwatch.step_count == 5 and hook.memwatch.epoch == 0
    hook.watch_dataloader(resumed)
    train(acc, model, opt, resumed, epochs=1)
    assert hook.memwatch.epoch == 1 and hook.memwatch.epochs[-1].n_steps == 10  # 5 + 5
    hook.detach()
    assert "end" not in vars(resumed)
