"""A run's answer: checks sized to a run of unknown length, the last word when it ends, and what it
leaves in its out_dir (report.html, summary.json), also when it is never closed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import memwatch
from memwatch.bundle.blackbox import find_records
from memwatch.bundle.run_summary import read_summary
from memwatch.core.errors import BundleError
from memwatch.session.cadence import SizedChecks
from memwatch.session.scheduler import Scheduler
from memwatch.sinks import MemorySink
from memwatch.testing import FakeDevice

MIB = 1 << 20
GIB = 1 << 30


def test_sized_checks_wait_for_the_cpu_floor_and_then_double() -> None:
    clock = [0.0]
    sized = SizedChecks(cap=5000, floor_s=0.1, cpu=lambda: clock[0])
    s, ran = Scheduler(), []
    s.checks(sized, None, by_steps=ran.append, by_time=ran.append, step=0, now=0.0)
    for step in range(1, 2000):
        clock[0] += 0.0005  # half a millisecond of CPU a step
        if step >= s.next_due:
            s.run(step, now=0.0)
            if ran and ran[-1] == step:
                s.checked(step, 0.0)
    # step 100 had 0.05 s of CPU: it waits for the floor (asked again 16 steps on), and so
    # does 400 (0.0955 s since the check at 209: asked again an eighth of its steps on); the
    # steps then double
    assert ran[0] in range(200, 217) and ran[1] == 450 and ran[2:] == [800, 1600]


def test_an_early_check_waits_twenty_times_what_the_last_one_took() -> None:
    clock = [0.0]
    sized = SizedChecks(cap=5000, floor_s=0.1, cpu=lambda: clock[0])
    clock[0] += 0.2
    assert sized.ready(100)  # 0.2 s of CPU since the start: over the 0.1 s floor
    clock[0] += 0.05  # the check (a census) took 50 ms
    sized.checked()
    clock[0] += 0.9
    assert not sized.ready(200)  # 0.9 s < 20 x 50 ms
    clock[0] += 0.2
    assert sized.ready(200)
    clock[0] += 0.5
    sized.checked()  # took 0.5 s
    assert sized.ready(5000)  # the cap's multiples keep the fixed cadence: no floor
    assert sized.recheck(4900, 3200) == 5000  # a waiting early check never passes the cap's


def test_the_cpu_floor_never_moves_a_check_past_the_steps_of_a_fast_loop() -> None:
    # Where ranks exchange summaries there is no floor: the steps alone decide.
    sized = SizedChecks(cap=5000, floor_s=None, cpu=lambda: 0.0)
    assert sized.ready() and sized.due_after(0) == 100 and sized.due_after(3200) == 5000


def _loop(mw: memwatch.MemWatch, dev: FakeDevice, steps: int, rate: float) -> None:
    for s in range(steps):
        dev.set(allocated=int(GIB + s * rate))
        mw.step()


def test_the_last_word_judges_what_came_after_the_last_check(tmp_path: Path) -> None:
    dev, sink = FakeDevice(total_bytes=2 * GIB), MemorySink()
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp_path,
                        check_every_n_steps=400, check_every_s=None, sinks=[sink],
                        warn=False) as mw:
        _loop(mw, dev, 1000, 200_000)
        assert mw.checks == 2  # steps 400 and 800
    assert mw.checks == 3
    final = [r for r in sink.reports if r.at == "final"]
    assert len(final) == 1 and final[0].step == 1000 and final[0].summary.n_steps == 200
    leak = [f for f in mw.current_findings() if f.kind == "leak"]
    assert leak and leak[0].step == 1000  # the current verdict is the last word's
    doc = read_summary(tmp_path)
    assert doc["steps"] == 1000 and doc["checks"] == 3 and doc["exit"]["status"] == "completed"
    assert doc["verdict"].startswith(("warning: leak", "critical: leak"))
    assert "epoch" not in json.dumps(doc)  # a loop without epochs is told in steps only


def test_no_last_word_when_the_last_check_saw_everything(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=GIB)
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp_path,
                        check_every_s=None) as mw:
        _loop(mw, dev, 50, 0)
        mw.end_epoch()
    assert mw.checks == 1  # the epoch end; nothing came after it


def _plain_loop(tmp_path: Path, leaks: bool, width: int, batch: int,
                passes: int) -> tuple[memwatch.MemWatch, MemorySink, list[int]]:
    """A 1,200-step plain loop at the defaults (no epochs, no length said), keeping ~100 KiB a
    step in a dict when ``leaks``: the session, its sink, and the steps checked before close."""
    model = torch.nn.Linear(width, width)
    cache: dict[int, bytearray] = {}
    sink = MemorySink()
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, warn=False,
                        sinks=[sink]) as mw:
        for step in range(1200):
            for _ in range(passes):
                model(torch.randn(batch, width)).sum().backward()
            if leaks:
                cache[step] = bytearray(100 * 1024)
            mw.step()
        during = [r.step for r in sink.reports]
    return mw, sink, during


@pytest.mark.fresh_process  # a host leak RSS shows only in a heap with no free memory to reuse
def test_a_short_run_of_unknown_length_is_judged_at_the_defaults(tmp_path: Path) -> None:
    # The defaults with real work per step (the CPU floor counts it): a first check within a
    # few hundred steps (100 steps of this work are well over the 0.1 s floor; a check that
    # waits for it is asked again 16 steps on), more as the CPU since the last one allows
    # (twenty times what it took: how many depends on this machine's ratio of a check to a
    # step, so not counted here), and the last word at 1,200 naming the dict that keeps
    # 100 KiB a step. At the old fixed 5,000 steps no check ran before the close.
    mw, sink, during = _plain_loop(tmp_path, leaks=True, width=256, batch=64, passes=4)
    assert during and during[0] <= 400 and during == sorted(set(during)), during
    assert [(r.step, r.at) for r in list(sink.reports)[len(during):]] == [(1200, "final")]
    leak = [f for f in mw.current_findings() if f.kind == "leak"]
    assert leak and "cache (dict" in str(leak[-1].culprit), [f.culprit for f in mw.findings]


@pytest.mark.fresh_process  # (as above: a pytest worker's heap reuses what earlier tests freed)
@pytest.mark.parametrize("leaks", [True, False], ids=["leak", "clean"])
def test_the_last_word_after_a_check_just_before_close_judges_that_checks_stretch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leaks: bool) -> None:
    # Where the sized checks fall depends on what each check cost in CPU: on a busy machine the
    # second one came at step 1,180 of a 1,200-step loop. Its leak verdicts wait for the last
    # word (no epoch said how long the loop's rhythm is), whose 20 steps alone showed nothing:
    # the run ended "ok" (CI, 2026-11-28). The last word judges steps 100-1,180 instead.
    plan = [100, 1190]
    monkeypatch.setattr(SizedChecks, "due_after",
                        lambda self, step: next((p for p in plan if p > step), 10**9))
    monkeypatch.setattr(SizedChecks, "ready", lambda self, due=None: True)
    mw, sink, _ = _plain_loop(tmp_path, leaks=leaks, width=64, batch=16, passes=1)
    assert [(r.step, r.at) for r in sink.reports] == [(100, "interval"), (1190, "interval"),
                                                      (1200, "final")]
    leak = [f for f in mw.current_findings() if f.kind == "leak"]
    if leaks:
        assert leak and "cache (dict" in str(leak[-1].culprit), [f.to_dict() for f in mw.findings]
        assert leak[-1].check == 2  # the last word's
    else:
        assert not leak, [f.to_dict() for f in leak]


def test_a_session_never_closed_is_closed_cleanly_at_exit(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = textwrap.dedent(f"""
        import memwatch
        mw = memwatch.MemWatch(device="cpu", workers=False, out_dir={str(out)!r},
                               blackbox_every_s=0.05, interval_s=0.05)
        mw.start()
        for _ in range(30):
            mw.step()
        # no close(): the interpreter exits
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    doc = read_summary(out)
    assert doc["steps"] == 30 and doc["checks"] == 1 and doc["exit"]["status"] == "completed"
    assert (out / "report.html").is_file()
    assert find_records(out) == []  # a clean close leaves no "ended without a clean close"


def test_a_run_that_raises_says_so_in_its_summary(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False):
            raise ValueError("boom")
    end = read_summary(tmp_path)["exit"]
    assert end["status"] == "failed" and end["exception"] == "builtins.ValueError"


@pytest.mark.parametrize("report,files", [("none", set()), ("tables", {"report.html",
                                                                         "summary.json"})])
def test_report_option(tmp_path: Path, report: str, files: set[str]) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                        blackbox_every_s=None, recorder=False, run_report=report) as mw:
        mw.step()
    assert {p.name for p in tmp_path.iterdir()} == files
    if report == "tables":
        assert "Charts are left out" in (tmp_path / "report.html").read_text()


def _summary(tmp_path: Path, **doc: Any) -> Path:
    p = tmp_path / "summary.json"
    p.write_text(json.dumps({"schema_version": 1, "kind": "memwatch-run", "verdicts": [],
                             **doc}))
    return p


@pytest.mark.parametrize("doc,fragment", [
    ({"schema_version": 2}, "unknown summary schema_version 2"),
    ({"kind": "something-else"}, "not a memwatch run summary"),
    ({"verdicts": [{"kind": 3}]}, "field 'verdicts'"),
    ({"steps": "many"}, "field 'steps'"),
])
def test_a_summary_is_read_trusting_nothing(tmp_path: Path, doc: dict[str, Any],
                                            fragment: str) -> None:
    with pytest.raises(BundleError, match=fragment):
        read_summary(_summary(tmp_path, **doc))


def test_a_summary_behind_a_symlink_is_not_read(tmp_path: Path) -> None:
    real = _summary(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "summary.json").symlink_to(real)
    with pytest.raises(BundleError, match="symlink"):
        read_summary(tmp_path / "d")
