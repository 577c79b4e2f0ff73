"""The current belief with its history on the report's first screen and ``memwatch run``'s exit
summary (issue 40): a leak that stopped is a card that says so, with its history, the chart's
trend ends where the growth stopped, and the exit summary lists it as withdrawn; a leak that
keeps growing is said as before."""

from __future__ import annotations

from pathlib import Path

import pytest

import memwatch
from memwatch.analysis.beliefs import state_of
from memwatch.autorun.console import ConsoleSink, exit_lines
from memwatch.report.data import from_run
from memwatch.report.html import render
from memwatch.report.trends import fit_trend
from memwatch.report.verdicts import cards
from sinks_helpers import leak_run


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> memwatch.MemWatch:
    # 2 MiB a step for two epochs of 100 steps, then flat for four.
    return leak_run(tmp_path_factory.mktemp("stopped"), [], epochs=6, steps=100, stop_after=2)


def test_the_card_of_a_leak_that_stopped_says_so_with_its_history(
        stopped: memwatch.MemWatch) -> None:
    data = from_run(stopped)
    (card,) = [c for c in cards(data) if c.metric == "device.allocated"]
    assert card.kind == "plateau" and card.severity == "info"
    assert card.history is not None and card.history.startswith("leak at epoch 1")
    assert "→ stopped at epoch" in card.history
    html = render(data)
    assert "leak, stopped" in html and "History" in html


def test_no_trend_is_drawn_past_where_the_growth_stopped(stopped: memwatch.MemWatch) -> None:
    data = from_run(stopped)
    trend = fit_trend(data, "device.allocated")
    assert trend is not None and trend.stopped_at is not None
    assert trend.x1 <= trend.stopped_at <= 201 and trend.limit_step is None
    assert "where it stopped" in trend.describe()


def test_the_exit_summary_lists_the_current_verdicts_and_the_withdrawn(
        stopped: memwatch.MemWatch, tmp_path: Path) -> None:
    lines = exit_lines("train.py", stopped.step_count, stopped.checks, stopped.findings, None,
                       None)
    assert lines[0].endswith("no leak, no warning; 1 withdrawn"), lines
    assert lines[1].startswith("  withdrawn: device.allocated: leak at epoch 1"), lines
    growing = leak_run(tmp_path, [], epochs=3, steps=100)
    lines = exit_lines("train.py", growing.step_count, growing.checks, growing.findings, None,
                       None)
    assert "1 verdict(s)" in lines[0] and "leak in device.allocated" in lines[1], lines


def test_the_console_says_the_change_once(stopped: memwatch.MemWatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from memwatch.core.protocols import CheckReport

    sink = ConsoleSink()
    for f in stopped.findings:
        sink.on_check(CheckReport("train", f.epoch or 0, f.step or 0, f.check or 0,
                                  "epoch_end", [f]))
    err = capsys.readouterr().err.splitlines()
    assert [s for s in err if "leak in device.allocated" in s], err
    changes = [s for s in err if "stopped growing" in s]
    assert len(changes) == 1 and "withdrawn" in changes[0], err
    assert [state_of(f) for f in stopped.current_findings()
            if f.belief == stopped.findings[0].belief]
