"""Issue 16: workers that multiply (their count rises: named at what keeps the old DataLoaders)
and copy-on-write that saturates inside the first epoch, on real DataLoader worker processes.
Each loop runs in its own interpreter (tests/worker_loops.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from loop_runs import LoopRuns
from memwatch.analysis.stats.settle import count_rising
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.analysis.stats.trend import Trend

run_loop = LoopRuns(Path(__file__).with_name("worker_loops.py"))


def _all(epochs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [f for fs in epochs for f in fs]


def test_rebuilt_loaders_are_a_worker_count_leak_named_at_their_holder(tmp_path: Path) -> None:
    fs = _all(run_loop("rebuilt", tmp_path))
    counts = [f for f in fs if f["metric"] == "workers.count"]
    assert counts, fs
    first = counts[0]
    assert first["kind"] == "leak" and first["evidence"]["pattern"] == "worker_count"
    assert first["rule"] == "worker_count"
    assert first["epoch"] <= 2  # two rises of the count's floor: the third check
    assert "worker_loops.acc.loaders (list," in first["culprit"], first["culprit"]
    assert any("persistent_workers=False" in s for s in first["suggestions"])
    # never called per-worker growth
    assert not [f for f in fs if f["metric"] == "workers.uss" and f["kind"] == "leak"], fs


def test_reused_loader_is_quiet(tmp_path: Path) -> None:
    fs = _all(run_loop("reused", tmp_path))
    assert not [f for f in fs if f["metric"].startswith("workers.")], fs
    assert not [f for f in fs if f["kind"] == "leak"], fs


def test_copy_on_write_reported_in_the_first_epoch(tmp_path: Path) -> None:
    epochs = run_loop("cow", tmp_path)
    cow = [f for f in epochs[0] if f["evidence"].get("pattern") == "copy_on_write"]
    assert cow, epochs
    assert "numpy" in " ".join(cow[0]["suggestions"]) or "Arrow" in " ".join(cow[0]["suggestions"])
    assert not [f for f in _all(epochs) if f["kind"] == "leak"], epochs


def test_numpy_dataset_no_copy_on_write(tmp_path: Path) -> None:
    fs = _all(run_loop("cow_numpy", tmp_path))
    cow = [f for f in fs if f["evidence"].get("pattern") == "copy_on_write"]
    assert not cow, [(f["epoch"], f["message"][:160], f["evidence"]) for f in cow]
    assert not [f for f in fs if f["kind"] == "leak"], fs


def _stats(floors: list[float]) -> list[EpochStats]:
    tr = Trend(n=10, s=0.0, z=0.0, p=1.0, slope=0.0, slope_low=0.0, slope_high=0.0,
               intercept=0.0, r1=0.0, noise=0.0)
    return [EpochStats(epoch=i, metric="workers.count", n_points=10, n_steps=100,
                       seconds_per_step=0.01, level=f, floor=f, peak=f + 2, lo_start=f,
                       lo_end=f, rise=0.0, trend=tr, noise=0.0, threshold=1.0, shape="flat",
                       unit=f"e{i}") for i, f in enumerate(floors)]


@pytest.mark.parametrize(("floors", "rising"), [
    ([2, 4, 6], True),
    ([2, 4, 4], False),  # one rise: an eval loader built once more is not yet a pattern
    ([2, 2, 2], False),  # eval workers that come and go lift the peaks, never the floor
    ([0, 2, 4, 4], False),
    ([2], False),
])
def test_count_rule(floors: list[float], rising: bool) -> None:
    assert count_rising(_stats(floors)) is rising


def _unit(i: int, metric: str, floor: float, end: float) -> EpochStats:
    (st,) = _stats([floor])
    return dataclasses.replace(st, epoch=i, metric=metric, lo_end=end, unit=f"e{i}")


def test_units_before_every_worker_started_are_no_evidence() -> None:
    from memwatch.analysis.rules.workers import _steady

    uss = [_unit(i, "workers.uss", 10.0 + i, 10.5 + i) for i in range(4)]
    counts = [_unit(i, "workers.count", c, c) for i, c in enumerate([0, 2, 2, 2])]
    assert [h.unit for h in _steady(uss, counts)] == ["e1", "e2", "e3"]
    assert _steady(uss, counts[:3]) == uss  # (counts of another unit: all kept)


@pytest.mark.parametrize(("uss_up", "rss_up", "private"), [
    (10.0, 9.0, True),   # a cache in each worker: new pages, RSS rises as much as USS
    (10.0, 1.0, False),  # copy-on-write: shared pages turned private, RSS flat
    (10.0, 4.0, False),
    (-1.0, 0.0, True),   # nothing rose: nothing to argue about
])
def test_private_growth_needs_rss_to_rise_with_uss(uss_up: float, rss_up: float,
                                                   private: bool) -> None:
    from memwatch.analysis.rules.workers import _private_growth

    uss = [_unit(0, "workers.uss", 100.0, 100.0), _unit(1, "workers.uss", 100.0, 100.0 + uss_up)]
    rss = [_unit(0, "workers.rss", 500.0, 500.0), _unit(1, "workers.rss", 500.0, 500.0 + rss_up)]
    assert _private_growth(uss, rss) is private
    assert _private_growth(uss, []) is True  # RSS unknown: USS decides alone


def test_the_oldest_loader_is_the_one_whose_workers_started_first() -> None:
    """Not the collector's listing order (youngest generation first): the kernel's start time
    of each loader's workers."""
    import os
    import subprocess
    import sys

    from memwatch.analysis.culprits.holders import loaders

    @dataclasses.dataclass
    class Worker:
        pid: int

    @dataclasses.dataclass
    class Iterator:
        _workers: list[Worker]

    @dataclasses.dataclass
    class Loader:
        _iterator: Iterator

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        new, old = Loader(Iterator([Worker(child.pid)])), Loader(Iterator([Worker(os.getpid())]))
        assert min([new, old], key=loaders._workers_started) is old
        assert min([old, new], key=loaders._workers_started) is old
    finally:
        child.kill()
        child.wait()
