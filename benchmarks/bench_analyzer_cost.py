"""Cost of the analyzer's statistics: 100,000 samples of one metric must take under 10 ms.

Also times a whole ``end_epoch()`` verdict on a 10,000-step epoch of FakeDevice counters (census
off: the census is measured separately and reported in every finding's evidence).

Prints a table and writes benchmarks/results/analyzer_cost.json.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import memwatch
from memwatch.analysis.stats.trend import bucket, saturation_ratio, step_change, trend_test
from memwatch.testing import FakeDevice

RESULTS = Path(__file__).parent / "results"


def series_cost(n: int, repeats: int = 21) -> float:
    rng = np.random.default_rng(0)
    y = 1e9 + np.arange(n) * 100.0 + rng.normal(0, 1e5, n)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mids, floors = bucket(y, 256)
        trend_test(mids, floors)
        step_change(mids, floors)
        saturation_ratio(mids, floors)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000.0


def end_epoch_cost(steps: int = 10_000, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        dev = FakeDevice(total_bytes=80 << 30)
        with memwatch.watch(device=dev, host=False, workers=False, census="never",
                            out_dir=tempfile.mkdtemp()) as mw:
            for e in range(2):
                for i in range(steps):
                    dev.set(allocated=(1 << 30) + (e * steps + i) * 4096)
                    mw.step()
                t0 = time.perf_counter()
                mw.end_epoch()
                if e == 1:
                    times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000.0


def main() -> None:
    rows = [(f"statistics, {n:,} samples of one metric", series_cost(n), 10.0)
            for n in (10_000, 100_000, 1_000_000)]
    rows.append(("end_epoch() verdicts, 10,000-step epoch, FakeDevice", end_epoch_cost(), None))
    print(f"{'case':58} {'median ms':>10} {'target':>8}")
    for name, ms, target in rows:
        verdict = "" if target is None else ("PASS" if ms <= target else "MISS")
        tgt = "" if target is None else f"<= {target:g}"
        print(f"{name:58} {ms:10.2f} {tgt:>8} {verdict}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "analyzer_cost.json").write_text(json.dumps(
        [{"case": n, "median_ms": ms, "target_ms": t} for n, ms, t in rows], indent=2))


if __name__ == "__main__":
    main()
