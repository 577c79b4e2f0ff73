"""The background sampler's pace: a costly pass stretches the wait when the period is
memwatch's to pick (``interval_s=None``), and never when the user gave one."""

from __future__ import annotations

import time
from collections.abc import Callable
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


def _passes(share: float | None, n: int) -> tuple[BackgroundSampler, SlowReader]:
    """Run the thread until it made ``n`` passes (or for 0.6 s when ``n`` is 0): the passes are
    counted, never a number expected within a wall-clock time (a starved thread passes less)."""
    reader = SlowReader([Costly(0.004)], lambda p, e: None)  # type: ignore[list-item]
    costs = Costs()
    s = BackgroundSampler(reader, 0.01, costs=costs, share=share)
    s.start()
    try:
        if n:
            _wait_for(lambda: reader.passes >= n)
        else:
            time.sleep(0.6)
    finally:
        s.stop()
    assert costs.seconds["background reads"] >= 0.004  # the passes' CPU is counted
    return s, reader


def _wait_for(cond: Callable[[], bool], hang_s: float = 120.0) -> None:
    """Until ``cond()``: the bound only stops a hung thread from hanging the suite."""
    end = time.monotonic() + hang_s
    while not cond():
        assert time.monotonic() < end, "the background thread stopped passing"
        time.sleep(0.005)


def test_a_costly_pass_stretches_the_wait_when_paced() -> None:
    paced, reader = _passes(PACED_SHARE, 0)
    # 4 ms of CPU a pass at 0.5% of a core: at least 0.8 s to the next pass, not 10 ms (an
    # upper bound on passes: load can only make them fewer)
    assert paced.wait_s >= 0.004 / PACED_SHARE
    assert 1 <= reader.passes <= 2


def test_a_period_the_user_gave_is_kept() -> None:
    fixed, reader = _passes(None, 10)
    assert fixed.wait_s == 0.01  # after 10 passes of 4 ms each, 40% of a core: kept


def test_a_pass_on_another_thread_counts_for_the_pace() -> None:
    """The refresh a unit's first step owes is a pass too: the background waits from it, so
    that both threads' passes together keep to the pace (short units refreshed every few
    seconds left the background passing on top). Decided on an injected clock."""
    reader = SlowReader([Costly(0.0)], lambda p, e: None)  # type: ignore[list-item]
    now = [100.0]
    s = BackgroundSampler(reader, 0.2, costs=Costs(), share=None, clock=lambda: now[0])
    assert not s.due()
    for _ in range(14):  # a pass elsewhere every 50 ms: the background's is never due
        now[0] += 0.05
        s.passed(0.0)
        assert not s.due()
    now[0] += 0.19
    assert not s.due()
    now[0] += 0.01  # left alone for its period: due again
    assert s.due()


def test_left_alone_it_passes_at_its_own_period() -> None:
    reader = SlowReader([Costly(0.0)], lambda p, e: None)  # type: ignore[list-item]
    s = BackgroundSampler(reader, 0.05, costs=Costs(), share=None)
    s.start()
    try:
        _wait_for(lambda: reader.passes >= 3)
    finally:
        s.stop()


def test_the_session_paces_only_when_interval_s_is_left_to_it(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / "a") as mw:
        assert mw.interval_s is None and mw._sampling.sampler.share == PACED_SHARE
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / "b",
                        interval_s=0.5) as mw:
        assert mw.interval_s == 0.5 and mw._sampling.sampler.share is None
        assert mw._sampling.sampler.interval_s == 0.5

