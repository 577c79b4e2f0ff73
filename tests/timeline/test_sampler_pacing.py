"""The background sampler's pace: a costly pass stretches the wait when the period is
memwatch's to pick (``interval_s=None``), and never when the user gave one."""

from __future__ import annotations

import time
from pathlib import Path

import memwatch
from memwatch.core.costs import Costs
from memwatch.timeline.sampler import PACED_SHARE, BackgroundSampler, SlowReader


class Costly:
    """A probe whose slow read burns ``cpu_s`` of this thread's CPU."""

    name = "costly"
    fast_keys: tuple[str, ...] = ()
    slow_keys = ("costly.value",)

    def __init__(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s

    def read_slow(self) -> dict[str, float]:
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.cpu_s:
            pass
        return {"costly.value": 1.0}


def _passes(share: float | None, seconds: float = 0.6) -> tuple[BackgroundSampler, SlowReader]:
    reader = SlowReader([Costly(0.004)], lambda p, e: None)  # type: ignore[list-item]
    costs = Costs()
    s = BackgroundSampler(reader, 0.01, costs=costs, share=share)
    s.start()
    time.sleep(seconds)
    s.stop()
    assert costs.seconds["background reads"] >= 0.004  # the passes' CPU is counted
    return s, reader


def test_a_costly_pass_stretches_the_wait_when_paced() -> None:
    paced, reader = _passes(PACED_SHARE)
    # 4 ms of CPU a pass at 0.5% of a core: at least 0.8 s to the next pass, not 10 ms
    assert paced.wait_s >= 0.004 / PACED_SHARE
    assert reader.passes <= 2


def test_a_period_the_user_gave_is_kept() -> None:
    fixed, reader = _passes(None)
    assert fixed.wait_s == 0.01
    assert reader.passes >= 10  # 0.6 s of 10 ms waits and 4 ms passes, with room for load


def test_the_session_paces_only_when_interval_s_is_left_to_it(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / "a") as mw:
        assert mw.interval_s is None and mw._sampling.sampler.share == PACED_SHARE
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / "b",
                        interval_s=0.5) as mw:
        assert mw.interval_s == 0.5 and mw._sampling.sampler.share is None
        assert mw._sampling.sampler.interval_s == 0.5


def test_a_pass_on_another_thread_counts_for_the_pace() -> None:
    """The refresh a unit's first step owes is a pass too: the background waits from it, so
    that both threads' passes together keep to the pace (short units refreshed every few
    seconds left the background passing on top)."""
    reader = SlowReader([Costly(0.0)], lambda p, e: None)  # type: ignore[list-item]
    s = BackgroundSampler(reader, 0.2, costs=Costs(), share=None)
    s.start()
    try:
        t0, mine = time.monotonic(), 0
        while time.monotonic() - t0 < 0.7:  # a pass elsewhere every 50 ms: never 0.2 s apart
            reader.poll()
            s.passed(0.0)
            mine += 1
            time.sleep(0.05)
        assert reader.passes - mine <= 1, (reader.passes, mine)
    finally:
        s.stop()
    # Left alone, it passes at its own period again.
    s2 = BackgroundSampler(reader, 0.05, costs=Costs(), share=None)
    before = reader.passes
    s2.start()
    time.sleep(0.4)
    s2.stop()
    assert reader.passes - before >= 3
