"""Acceptance (6), smoke form: the overhead benchmark runs end to end and writes its JSON.

The figures come from the full run (``python benchmarks/bench_transformers_overhead.py``); on a
shared 2-core test machine a quick run's ratios are noise, so only gross regressions fail here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def test_overhead_benchmark_quick_mode(
    quick_benchmark: Callable[[str], tuple[Any, dict[str, Any]]],
) -> None:
    res, on_disk = quick_benchmark("bench_transformers_overhead")
    assert on_disk["ratio_median"] == res["ratio_median"]
    assert set(on_disk["step_ms"]) == {"baseline", "memwatch"}
    r = on_disk["ratio_median"]
    assert math.isfinite(r) and 0.2 < r < 5.0, on_disk
    assert len(on_disk["ratio_median_per_repeat"]) == on_disk["config"]["repeats"]
    assert on_disk["quick"] is True and on_disk["target_memwatch_ratio"] == 1.01
    # The hook itself: tens of microseconds of thread CPU time (what a loaded machine cannot
    # move: beside two busy loops its wall-clock median once read 2.3 ms for 76 us of CPU).
    assert on_disk["memwatch_hook_us"]["thread_cpu_median"] < 2000, on_disk["memwatch_hook_us"]
