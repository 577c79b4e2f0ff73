"""The controller in this process, with real torch optimizers: one session, sampled at each step
of one optimizer; nothing counted twice when an adapter or the script's own MemWatch watches;
time mode until an optimizer steps; the report and the summary at exit. And
:func:`memwatch.autorun.frameworks.wrap_init` on plain classes.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import memwatch
from memwatch.autorun.controller import Controller
from memwatch.autorun.frameworks import wrap_init
from memwatch.autorun.plan import Plan, Target


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[Controller] = []

    def build(**options: Any) -> Controller:
        opts = {"workers": False, "out_dir": str(tmp_path / "out"), **options}
        ctl = Controller(Plan(Target(script="train.py"), {"run_report": "tables", **opts}))
        ctl.on_import("torch", torch)
        made.append(ctl)
        return ctl

    yield build
    for ctl in made:
        ctl.detach()


def _opt() -> torch.optim.Optimizer:
    model = torch.nn.Linear(4, 1)
    return torch.optim.SGD(model.parameters(), lr=0.1)


def _steps(opt: torch.optim.Optimizer, n: int) -> None:
    for _ in range(n):
        opt.step()


def test_a_plain_loop_is_sampled_once_per_step_of_its_first_optimizer(make: Any) -> None:
    ctl = make()
    first, second = _opt(), _opt()
    _steps(first, 3)
    assert ctl.mode == "plain" and ctl.memwatch is not None
    _steps(second, 5)  # a second optimizer (a GAN's discriminator) is not sampled
    _steps(first, 2)
    assert ctl.memwatch.step_count == 5
    mw = ctl.memwatch
    del first  # the sampled optimizer is gone: the next one to step is sampled
    _steps(second, 4)
    assert ctl.memwatch is mw and mw.step_count == 9


def test_nothing_is_counted_while_an_adapter_watches(make: Any) -> None:
    ctl = make()
    opt = _opt()
    _steps(opt, 2)
    own = ctl.memwatch
    ctl.take_over(None, "an adapter")  # e.g. a Trainer created after a few manual steps
    assert own is not None and own.closed and ctl.memwatch is None
    _steps(opt, 5)  # the framework steps the optimizer too: the adapter samples those steps
    assert ctl.mode == "adapter" and ctl.memwatch is None and own.step_count == 2


def test_the_scripts_own_memwatch_is_left_alone(make: Any, tmp_path: Path) -> None:
    ctl = make()
    opt = _opt()
    _steps(opt, 2)
    own = ctl.memwatch
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path / "mine")) as mine:
        assert ctl.mode == "user" and own is not None and own.closed
        _steps(opt, 3)
        mine.step()
    assert mine.step_count == 1 and ctl.memwatch is None


def test_time_mode_samples_until_an_optimizer_steps(make: Any) -> None:
    ctl = make(interval_s=0.02)  # time mode after 10 intervals: 0.2 s
    deadline = time.monotonic() + 10
    while (ctl.mode != "time" or ctl.memwatch.step_count < 3) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ctl.mode == "time", ctl.mode
    mw = ctl.memwatch
    opt = _opt()
    _steps(opt, 1)
    assert ctl.mode == "plain" and ctl.memwatch is mw  # the same session, now per step
    n = mw.step_count
    time.sleep(0.1)
    assert mw.step_count == n  # the timer stopped sampling
    _steps(opt, 2)
    assert mw.step_count == n + 2


def test_at_exit_the_session_closes_and_the_report_and_summary_are_written(
        make: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ctl = make()
    _steps(_opt(), 20)
    mw = ctl.memwatch
    ctl.at_exit()
    assert mw is not None and mw.closed and ctl.mode == "off"
    err = capsys.readouterr().err
    # one check: the last word, at the close, on the 20 steps seen
    assert "memwatch: watched the plain loop" in err and "20 step(s), 1 check(s)" in err
    report = tmp_path / "out" / "report.html"
    assert report.is_file() and f"memwatch: report: {report} (and summary.json)" in err
    assert (tmp_path / "out" / "summary.json").is_file()
    assert "Charts are left out" in report.read_text()  # --report tables


def test_wrap_init_calls_after_once_the_outermost_init_returned() -> None:
    class Trainer:
        def __init__(self, callbacks: list[str] | None = None) -> None:
            self.callbacks = list(callbacks or [])

    class Early(Trainer):  # defined before the wrap
        def __init__(self) -> None:
            super().__init__()
            self.callbacks.append("theirs")

    seen: list[tuple[str, list[str]]] = []
    wrap_init(Trainer, lambda t: seen.append((type(t).__name__, list(t.callbacks))))
    wrap_init(Trainer, lambda t: seen.append(("twice", [])))  # once per class

    class Late(Early):  # defined after the wrap
        def __init__(self, extra: str) -> None:
            super().__init__()
            self.callbacks.append(extra)

    class Plain(Trainer):  # no __init__ of its own
        pass

    Trainer(["a"])
    Early()
    Late("x")
    Plain()
    assert seen == [("Trainer", ["a"]), ("Early", ["theirs"]), ("Late", ["theirs", "x"]),
                    ("Plain", [])]
    assert list(inspect.signature(Late).parameters) == ["extra"]
    assert list(inspect.signature(Trainer).parameters) == ["callbacks"]
