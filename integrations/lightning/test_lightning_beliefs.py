"""Verdicts that hold over the whole run (issue 40), on real Lightning fits.

* a clean fit whose replay buffer, ``deque(maxlen=N)``, fills mid-run ends with no leak on the
  console, in the exit summary, the report's first card or the current findings, and no advice
  to bound it;
* a leak that stops mid-run is reported as stopped, with its history, on every surface;
* a leak that grows in equal stairs at epoch ends is confirmed at the second stair;
* a training-only leak draws no validation-loop verdict.
"""

from __future__ import annotations

import collections
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning_helpers import Regressor, loader, make_trainer

from memwatch.analysis.beliefs import history, state_of
from memwatch.autorun.console import exit_lines
from memwatch.integrations.lightning import MemWatchCallback, MemWatchWarning
from memwatch.report.data import from_run
from memwatch.report.trends import fit_trend
from memwatch.report.verdicts import cards, clean_line

STEPS = 32  # training batches per epoch


class Replay(Regressor):
    """Keeps the last ``2 * STEPS`` inputs of ~200 KB in a bounded replay buffer: memory climbs
    for two epochs and is flat after (a clean fit)."""

    def __init__(self) -> None:
        super().__init__()
        self.replay: collections.deque[torch.Tensor] = collections.deque(maxlen=2 * STEPS)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.replay.append(torch.randn(51_200))  # 200 KiB of float32
        return super().training_step(batch, batch_idx)


class StopsLeaking(Regressor):
    """Keeps ~200 KB a step in a plain list for the first three epochs, then stops (the bug was
    a debug dump switched off after warm-up)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.current_epoch < 3:
            self.kept.append(torch.randn(51_200))
        return super().training_step(batch, batch_idx)


class ValidationKeeps(Regressor):
    """Every validation keeps 4 MiB ("the epoch's predictions, for a plot at the end"): memory
    rises in equal stairs at the epoch ends, nothing grows inside an epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.val_outputs: list[torch.Tensor] = []

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.val_outputs.append(torch.randn(1 << 20))


def _leak_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "memwatch"]


@pytest.mark.fresh_process
def test_a_bounded_buffer_that_fills_is_no_leak_anywhere(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    cb = MemWatchCallback(workers=False)
    model = Replay()
    trainer = make_trainer(tmp_path, [cb], max_epochs=6, log_every_n_steps=8)
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        trainer.fit(model, loader(STEPS), loader(2))
    assert len(model.replay) == 2 * STEPS  # it really filled, at the end of epoch 1
    now = cb.current_findings()
    assert not [f for f in now if state_of(f) == "leak"], [f.to_dict() for f in now]
    # The console ends with no leak standing: none said, or each withdrawn in a line of its own.
    lines = _leak_lines(caplog)
    leaks = [s for s in lines if "leak in" in s]
    assert not leaks or any("withdrawn" in s for s in lines), lines
    # No advice to bound what is bounded, on any finding of the run.
    assert not [s for f in cb.findings for s in f.suggestions if "bound it" in s], \
        [f.to_dict() for f in cb.findings]
    mw = cb.memwatch
    assert mw is not None
    summary = exit_lines("the fit", mw.step_count, mw.checks, cb.findings, None, None)
    assert "no leak, no warning" in summary[0], summary
    data = from_run(mw)
    assert not [c for c in cards(data) if c.kind == "leak"], [c.message for c in cards(data)]
    assert clean_line(data).startswith("No leak")
    # The buffer was judged with its bound: a plateau that names it.
    bounded = [f for f in cb.findings if f.evidence.get("holder_bound")]
    assert bounded and "replay" in str(bounded[0].evidence.get("holder")), \
        [f.to_dict() for f in cb.findings]


@pytest.mark.fresh_process
def test_a_leak_that_stops_is_reported_as_stopped_on_every_surface(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cb = MemWatchCallback(workers=False)
    model = StopsLeaking()
    trainer = make_trainer(tmp_path, [cb], max_epochs=8, log_every_n_steps=8)
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        trainer.fit(model, loader(STEPS), loader(2))
    assert len(model.kept) == 3 * STEPS
    leaks = [f for f in cb.findings if f.kind == "leak" and f.stage == "train"]
    assert leaks, [f.to_dict() for f in cb.findings]
    belief = leaks[0].belief
    assert belief is not None
    (now,) = [f for f in cb.current_findings() if f.belief == belief]
    assert state_of(now) == "stopped" and now.kind == "plateau", now.to_dict()
    assert "kept" in now.message and "withdrawn" in now.message
    states = [c["state"] for c in history(cb.findings, belief)]
    assert states[0] == "leak" and states[-1] == "stopped", states
    # The console: the leak once, then its withdrawal in one line.
    lines = _leak_lines(caplog)
    stop_lines = [s for s in lines if "stopped growing" in s]
    assert len(stop_lines) == 1 and "\n" not in stop_lines[0], lines
    assert lines.index(stop_lines[0]) > next(i for i, s in enumerate(lines) if "leak in" in s)
    # memwatch run's exit summary: no verdict standing, one withdrawn with its history.
    mw = cb.memwatch
    assert mw is not None
    summary = exit_lines("the fit", mw.step_count, mw.checks, cb.findings, None, None)
    assert "no leak, no warning; 1 withdrawn" in summary[0], summary
    assert any(s.strip().startswith("withdrawn: host") and "→ stopped at epoch" in s
               for s in summary), summary
    # The report: the card says stopped, with its history; the chart's trend ends where the
    # growth stopped and forecasts nothing.
    data = from_run(mw)
    (card,) = [c for c in cards(data) if c.finding.get("belief") == belief]
    assert card.history is not None and card.history.startswith("leak at epoch"), card
    trend = fit_trend(data, now.metric)
    assert trend is not None and trend.stopped_at is not None and trend.limit_step is None
    assert trend.x1 <= trend.stopped_at


@pytest.mark.fresh_process
def test_equal_stairs_at_epoch_ends_are_confirmed_at_the_second(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False, total_steps=10_000_000)
    model = ValidationKeeps()
    trainer = make_trainer(tmp_path, [cb], max_epochs=4, log_every_n_steps=8)
    with pytest.warns(MemWatchWarning):  # a threat to the planned run
        trainer.fit(model, loader(STEPS), loader(2))
    leaks = [f for f in cb.findings if f.kind == "leak" and f.stage == "train"]
    assert leaks, [f.to_dict() for f in cb.findings]
    # Stair 1 at the end of epoch 0, stair 2 at the end of epoch 1: confirmed there, on the C
    # allocator's in-use bytes (read at the step after each background pass: exact stairs)
    # where glibc placed a stair in chunks it kept free and RSS shows it over the next epoch.
    assert leaks[0].epoch == 1, [f.to_dict() for f in leaks]
    assert len({f.belief for f in leaks}) == 1
    named = [f for f in leaks if f.culprit and "val_outputs" in f.culprit]
    assert named, [f.culprit for f in leaks]
    # What the run ends with: the one belief, still a leak, naming the list.
    (now,) = [f for f in cb.current_findings() if f.belief == leaks[0].belief]
    assert now.kind == "leak" and "val_outputs" in str(now.culprit), now.to_dict()
    assert not [f for f in cb.findings if f.kind == "leak" and f.stage != "train"]


@pytest.mark.fresh_process
def test_a_training_leak_draws_no_validation_verdict(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False)
    model = Regressor(leak_from_epoch=1)
    trainer = make_trainer(tmp_path, [cb], max_epochs=3, log_every_n_steps=8)
    trainer.fit(model, loader(48), loader(8))
    train = [f for f in cb.findings if f.kind == "leak" and f.stage == "train"]
    assert train, [f.to_dict() for f in cb.findings]
    assert cb.eval_memwatch.get("val") is not None  # the validation loop was watched
    assert not [f for f in cb.findings if f.stage == "val" and f.kind in ("leak", "plateau",
                                                                         "step_change")]
    assert len({f.belief for f in cb.current_findings() if state_of(f) == "leak"}) == 1
