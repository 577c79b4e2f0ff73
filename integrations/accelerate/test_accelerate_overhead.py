"""Acceptance (5), smoke form: the overhead benchmark runs end to end and writes its JSON.

The figures come from the full run (``python benchmarks/bench_accelerate_overhead.py``); on a
shared 2-core test machine a quick run's step-time ratios are noise, so only gross regressions
are caught here, plus the hook's own cost per call, which does not depend on the machine's load.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_accelerate_overhead.py"


def test_overhead_benchmark_quick_mode(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_accelerate_overhead", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "accelerate_overhead.json"
    threads = torch.get_num_threads()
    try:
        res = bench.main(["--quick", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    on_disk = json.loads(out.read_text())
    assert on_disk["ratio_median"] == res["ratio_median"]
    assert set(on_disk["step_ms"]) == {"baseline", "memwatch"}
    assert len(on_disk["ratio_median_per_repeat"]) == on_disk["config"]["repeats"]
    assert math.isfinite(on_disk["ratio_median"]) and 0.2 < on_disk["ratio_median"] < 5.0
    assert on_disk["quick"] is True and on_disk["target_memwatch_ratio"] == 1.01
    # The per-step hook: a few microseconds warm, tens in the loop (caches cold after backward).
    assert on_disk["memwatch_hook_us"]["median"] < 100, on_disk["memwatch_hook_us"]
    assert on_disk["memwatch_hook_us_in_situ"]["median"] < 500, on_disk

