"""Metrics read in the background: a unit is judged on the readings it holds, not on the rows
that repeat them (issue 24: a clean Lightning fit's ``host.rss_anon``, read once a 4-s epoch,
took a leak verdict's census)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memwatch.analysis import Analyzer, AnalyzerConfig, CheckContext
from memwatch.analysis.evidence import CensusPair
from memwatch.analysis.stats.shapes import read_noise
from memwatch.testing import RecordedEvidence
from memwatch.timeline import Timeline

MIB = 2.0**20
STEPS = 220  # a 4-s epoch of ~18 ms steps: the bench's Lightning fit


def test_the_passes_that_reach_a_unit_are_counted() -> None:
    tl = Timeline(["host.rss", "host.rss_anon", "workers.uss"], n_fast=1)
    slow = [float("nan")] * 2  # the reader's values before its first pass: no reading
    for step in range(1, 301):
        if step in (1, 40, 90, 150, 260):
            slow = [float(step), float(step)]  # a new list per pass, as the reader publishes
        tl.record(step, float(step), [float(step)], slow)
        if step == 120:
            seg = tl.end_segment()
            assert seg is not None and seg.reads("host.rss_anon") == 3
    ep = tl.end_epoch()
    assert ep is not None
    assert ep.reads("host.rss") is None  # read with every sample
    assert ep.reads("host.rss_anon") == ep.reads("workers.uss") == 5
    tl.record(301, 301.0, [301.0], slow)  # no pass in this unit: one reading, from before it
    ep = tl.end_epoch()
    assert ep is not None and ep.reads("workers.uss") == 1
    # A timeline of whole rows (append) reads every column with every sample.
    whole = Timeline(["host.rss", "host.rss_anon"])
    whole.append(1, 1.0, [1.0, 1.0])
    whole.append(2, 2.0, [1.0, 1.0])
    e2 = whole.end_epoch()
    assert e2 is not None and e2.reads("host.rss_anon") is None


@pytest.mark.parametrize("reads", [1, 2, 5, 20])
def test_read_noise_is_the_spread_of_the_least_of_uniform_readings(reads: int) -> None:
    rng = np.random.default_rng(reads)
    least = rng.uniform(0.0, 100.0, size=(40_000, reads)).min(axis=1)
    assert read_noise(100.0, reads) == pytest.approx(float(least.std()), rel=0.03)
    assert read_noise(0.0, reads) == 0.0


@dataclasses.dataclass
class _Census(RecordedEvidence):
    """Records whether each census collected garbage first (a verdict's census does)."""

    collected: list[bool] = dataclasses.field(default_factory=list)

    def census(self, *, collect: bool, count_types: bool, epoch: int, step: int,
               rss: float, at_most: int | None = None) -> CensusPair | None:
        self.collected.append(collect)
        return super().census(collect=collect, count_types=count_types, epoch=epoch,
                              step=step, rss=rss, at_most=at_most)


def _fit(anon_reads_mib: list[float], rss: list[float], every: int | None = None,
         rss_per_step: float = 0.0) -> tuple[Analyzer, _Census, list[list[str]]]:
    """Units of STEPS steps: ``host.rss`` (read every step) a sawtooth of 110 MiB above the
    unit's floor ``rss[e]`` (rising ``rss_per_step`` MiB a step); ``host.rss_anon`` read by
    background passes (the first at the unit's first step, then every ``every`` steps), each
    pass giving the unit's next value of ``anon_reads_mib``."""
    ev = _Census(objects=1000)
    tl = Timeline(["host.rss", "host.rss_anon"], n_fast=1)
    analyzer = Analyzer(AnalyzerConfig(), evidence=ev)
    kinds = []
    reads = iter(anon_reads_mib)
    for e, floor in enumerate(rss):
        slow: list[float] = []
        for i in range(STEPS):
            if i == 0 or every is not None and i % every == 0:
                slow = [next(reads) * MIB]
            saw = 110 * MIB * ((i * 7) % 20) / 19  # temporaries come and go within steps
            rss_now = (floor + rss_per_step * i) * MIB + saw
            tl.record(e * STEPS + i + 1, float(e * STEPS + i), [rss_now], slow)
        found = analyzer.check(tl.end_epoch(), CheckContext(census="auto"))  # type: ignore[arg-type]
        kinds.append([f"{f.kind}:{f.metric}" for f in found])
    return analyzer, ev, kinds


def test_a_part_of_rss_read_once_a_unit_does_not_climb_out_of_rss_swing() -> None:
    # The clean fit, as measured: RSS's floor flat, RSS swinging 110 MiB inside every epoch;
    # the one reading of anonymous memory a unit lands anywhere in that swing (309, 392, 480
    # MiB: climbs of 83 and 88 MiB, similar amounts, each "far over" a threshold of zero noise).
    analyzer, ev, kinds = _fit([309, 392, 480], rss=[484, 484, 484])
    anon = analyzer.history["host.rss_anon"]
    assert [h.floor / MIB for h in anon] == [309, 392, 480]
    assert all(h.threshold > 88 * MIB for h in anon)  # one reading in a swing of 110 MiB
    assert analyzer.config.held(anon) != "leak"
    assert True not in ev.collected  # no verdict's census (a gc.collect and a census, ~0.3 s)
    assert not any(kinds)


def test_the_same_climb_read_every_few_steps_is_judged_on_its_readings() -> None:
    # Twenty readings a unit, each unit's readings steady at its level: the floors are floors
    # now (their noise the spread of the least of 20 readings, 5% of the swing), and the same
    # three-unit climb is a leak of anonymous memory.
    levels = [309.0, 392.0, 480.0]
    analyzer, ev, _ = _fit([lv for lv in levels for _ in range(20)], rss=[484, 484, 484],
                           every=11)
    anon = analyzer.history["host.rss_anon"]
    assert all(h.threshold < 30 * MIB for h in anon)
    assert analyzer.config.held(anon) == "leak"
    assert True in ev.collected


def test_a_leak_rss_shows_is_still_found_with_its_parts_read_once_a_unit() -> None:
    # RSS itself climbs 250 MiB a unit, step by step (read every step, past its 110-MiB swing):
    # its verdict does not depend on how often its parts are read.
    _, _, kinds = _fit([300, 550, 800], rss=[484, 734, 984], rss_per_step=250 / STEPS)
    assert "leak:host.rss" in kinds[2]
