"""What the console says about findings (runtime/warn.py): a short first line, the suggestions on
lines of their own, a warning that points at the user's call, and one notice line for every new
leak verdict that is no threat to the run."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memwatch
from memwatch import Finding, MemWatchWarning
from memwatch.runtime.warn import HEADLINE_MAX, FindingWarner, headline, notice_text, warning_text
from memwatch.testing import FakeDevice

GIB, MIB = 1 << 30, 1 << 20

# A verdict as the analyzer words one (the message and suggestions of a real leak finding).
LEAK = Finding(
    kind="leak", metric="host.rss", severity="warning", bytes_per_step=790528.0,
    steps_to_oom=31433.0, seconds_to_oom=16200.0,
    culprit="trainer.kept_outputs (list, 40 tuples, +40 since the last check) — +10.8 MiB "
            "since the last check",
    message="This process's resident host memory (RSS) grows by 772.0 KiB per step (95% CI "
            "754.7 KiB–791.2 KiB per step) and is not released: its floor rose by 2.5 MiB (to "
            "378.9 MiB) over 2 epochs. At this rate the 23.5 GiB limit is reached in about "
            "31,433 steps (4.5 h). The list gained 40 tuples since the last check, about 275.4 "
            "KiB each. They keep their autograd graphs: 5252 nodes added since the last check.",
    suggestions=("Keep numbers, not graphs: accumulate `loss.item()` (a Python float) or "
                 "`loss.detach()`, e.g. `total += loss.item()`; a metric meter fed tensors "
                 "needs `.item()` at the call site.",
                 "`kept_outputs` grows every step: bound it (`collections.deque(maxlen=N)`), "
                 "or write what it collects to disk as you go."))


def test_the_warning_reads_well() -> None:
    text = warning_text(LEAK)
    first, *rest = text.split("\n")
    assert first == ("memwatch: leak in host.rss, held by trainer.kept_outputs: "
                     "+772.0 KiB/step, OOM in ~31,433 steps (4.5 h)")
    assert len(first) <= HEADLINE_MAX and all(len(line) <= 104 for line in rest)
    # Each suggestion starts a line of its own (no more "...; ..." run-on line).
    starts = [line.strip() for line in rest if line.startswith("    - ")]
    assert [s[2:12] for s in starts] == ["Keep numbe", "`kept_outp"]
    assert any(line.strip().startswith("held by: trainer.kept_outputs (list") for line in rest)
    assert "31,433 steps" in " ".join(rest)  # the whole verdict is still there


def test_the_headline_stays_short_whatever_the_holder() -> None:
    long_holder = Finding(kind="leak", metric="device.allocated", severity="critical",
                          message="grows.", bytes_per_step=1.5 * MIB, steps_to_oom=120.0,
                          culprit="local `cache` of running " + "deeply_nested_function." * 9
                          + "run() (train.py:12)[3] — +3 × float32[1024]")
    line = headline(long_holder, " [rank 3] [val loop]")
    # The holder gives way, from its start (a path ends with the container); rate and forecast
    # stay whole.
    assert len(line) <= HEADLINE_MAX and line.startswith(
        "memwatch [rank 3] [val loop]: leak in device.allocated, held by …")
    assert line.endswith("deeply_nested_function.run() (train.py:12)[3]: +1.5 MiB/step, "
                         "OOM in ~120 steps")
    # Without a rate, the verdict's first sentence says what it is.
    frag = Finding(kind="fragmentation", metric="device.reserved", severity="warning",
                   message="Reserved grows while allocated does not. Try expandable_segments.")
    assert headline(frag) == ("memwatch: fragmentation in device.reserved: Reserved grows while "
                              "allocated does not.")
    assert warning_text(frag).split("\n")[1].strip() == "Try expandable_segments."


def test_a_leak_that_is_no_threat_is_one_notice_line() -> None:
    info = Finding(**{**LEAK.to_dict(), "severity": "info", "seconds_to_oom": None})
    line = notice_text(info)
    assert "\n" not in line
    assert line.startswith("memwatch: leak in host.rss, held by trainer.kept_outputs: "
                           "+772.0 KiB/step, not a threat to this run (the limit is ~31,433 "
                           "steps away). Fix: Keep numbers, not graphs:")
    assert line.endswith("needs `.item()` at the call site.")  # the fix's whole first sentence


def _leak_loop(tmp: Path, steps: int, **options: Any) -> memwatch.MemWatch:
    dev, rng = FakeDevice(total_bytes=2 * GIB), np.random.default_rng(0)
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp, signals=False,
                        census="never", check_every_s=None, **options) as mw:
        for s in range(steps):
            dev.set(allocated=int(GIB + s * 200_000 + rng.normal(0, 1e6)))
            mw.step()  # the line a warning must point at
    return mw


def test_a_warning_points_at_the_users_step_call(tmp_path: Path) -> None:
    import inspect

    step_line = next(i for i, line in enumerate(inspect.getsourcelines(_leak_loop)[0])
                     if "mw.step()" in line) + inspect.getsourcelines(_leak_loop)[1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mw = _leak_loop(tmp_path, 2000, check_every_n_steps=400, total_steps=10_000)
    said = [w for w in caught if issubclass(w.category, MemWatchWarning)]
    assert [f.severity for f in mw.findings if f.kind == "leak"][:1] == ["warning"]
    assert len(said) == 1, [str(w.message) for w in said]
    # Not session.py or checks.py: the user's own line, whatever memwatch's call depth.
    assert (said[0].filename, said[0].lineno) == (__file__, step_line)


def test_every_new_leak_reaches_the_console_once(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # The run's planned length is its real one: the same growth is no threat to it (info).
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        mw = _leak_loop(tmp_path, 2000, check_every_n_steps=400, total_steps=2000)
    leaks = [f for f in mw.findings if f.kind == "leak"]
    assert len(leaks) >= 2 and {f.severity for f in leaks} == {"info"}
    lines = [r.getMessage() for r in caplog.records if "leak in" in r.getMessage()]
    assert len(lines) == 1 and "not a threat to this run" in lines[0], lines  # once, not per check


def test_watch_prints_the_notice_without_any_logging_set_up(tmp_path: Path,
                                                            run_python: Any) -> None:
    # A fresh interpreter, no logging configured, warnings as errors: what a plain-loop user
    # sees on stderr is the notice, one line, and nothing raises.
    proc = run_python(f"""
        import numpy as np, memwatch
        from memwatch.testing import FakeDevice
        dev, rng = FakeDevice(total_bytes=64 << 30), np.random.default_rng(0)
        with memwatch.watch(device=dev, host=False, workers=False, out_dir={str(tmp_path)!r},
                            census="never", total_steps=300, recorder=False) as mw:
            for epoch in range(3):
                for s in range(100):
                    dev.set(allocated=int((1 << 30) + (epoch * 100 + s) * 2**21
                                          + rng.normal(0, 1e5)))
                    mw.step()
                mw.end_epoch()
        print(sorted({{f.severity for f in mw.findings if f.kind == "leak"}}))
    """)
    assert proc.stdout.strip() == "['info']"
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("memwatch: leak in device.allocated: +2.0 MiB/step"
                                               ", not a threat to this run"), proc.stderr


def test_a_finding_told_by_one_warner_is_not_told_again(caplog: pytest.LogCaptureFixture) -> None:
    # A session the user hands to an adapter tells its own findings; the adapter's warner, which
    # sees the same objects, stays quiet about them.
    info = Finding(kind="leak", metric="host.rss", severity="info", message="grows.",
                   bytes_per_step=1024.0, culprit="Tiny.kept (list, 3 tensors)")
    first, second = FindingWarner(), FindingWarner()
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        first.tell([info])
        second.tell([info])
        assert len(caplog.records) == 1
        second.tell([Finding(**info.to_dict())])  # an equal verdict of another session is new
    assert len(caplog.records) == 2
    assert ("train", "leak", "host.rss#notice") in second.warned


def test_a_notice_without_holder_waits_one_check_for_it(caplog: pytest.LogCaptureFixture) -> None:
    # A leak that is no threat gets one line: the verdict without a holder (its census needs one
    # more check) is replaced by the next check's named verdict, whatever metric that one is on.
    early = Finding(kind="leak", metric="host.malloc_in_use", severity="info", message="grows.",
                    bytes_per_step=1024.0)
    named = Finding(kind="leak", metric="host.rss", severity="info", message="grows.",
                    bytes_per_step=1024.0, culprit="Tiny.kept (list, 3 tensors)")
    w = FindingWarner()
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        w.tell([early])
        w.end_check()
        assert caplog.records == []
        w.tell([named])
        w.end_check()
        w.flush()
    assert [r.getMessage()[:49] for r in caplog.records] == \
        ["memwatch: leak in host.rss, held by Tiny.kept: +1"]


def test_a_notice_without_holder_is_said_when_no_holder_comes(
        caplog: pytest.LogCaptureFixture) -> None:
    # ...and when the next check names nobody, the waiting line is said at its end; a session
    # that closes first says it then. Never a silent leak.
    early = Finding(kind="leak", metric="host.rss", severity="info", message="grows.",
                    bytes_per_step=1024.0)
    w = FindingWarner()
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        w.tell([early])
        w.end_check()
        w.tell([])
        assert caplog.records == []
        w.end_check()
        assert len(caplog.records) == 1
        w.tell([Finding(**early.to_dict())])  # said already
        w.end_check()
        w.end_check()
        assert len(caplog.records) == 1
        closing = FindingWarner()
        closing.tell([Finding(**early.to_dict())])
        closing.flush()
    assert len(caplog.records) == 2
