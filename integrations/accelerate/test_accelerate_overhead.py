"""Acceptance (5), smoke form: the overhead benchmark runs end to end and writes its JSON.

The figures come from the full run (``python benchmarks/bench_accelerate_overhead.py``); on a
shared 2-core test machine a quick run's step-time ratios are noise, so only gross regressions
are caught here, plus the hook's own cost per call in thread CPU time, which does not depend on
the machine's load.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def test_overhead_benchmark_quick_mode(
    quick_benchmark: Callable[[str], tuple[Any, dict[str, Any]]],
) -> None:
    res, on_disk = quick_benchmark("bench_accelerate_overhead")
    assert on_disk["ratio_median"] == res["ratio_median"]
    assert set(on_disk["step_ms"]) == {"baseline", "memwatch"}
    assert len(on_disk["ratio_median_per_repeat"]) == on_disk["config"]["repeats"]
    assert math.isfinite(on_disk["ratio_median"]) and 0.2 < on_disk["ratio_median"] < 5.0
    assert on_disk["quick"] is True and on_disk["target_memwatch_ratio"] == 1.01
    # The per-step hook: a few microseconds warm, tens in the loop (caches cold after backward),
    # in thread CPU time: a preemption by the machine's other work moves the wall-clock median
    # (a loaded fresh clone once read a transformers hook of 76 us of CPU as 2.3 ms), not this.
    assert on_disk["memwatch_hook_us"]["thread_cpu_median"] < 100, on_disk["memwatch_hook_us"]
    assert on_disk["memwatch_hook_us_in_situ"]["thread_cpu_median"] < 500, on_disk

