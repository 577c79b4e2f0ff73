"""Acceptance (6), smoke form: the overhead benchmark runs end to end and writes its JSON.

The figures come from the full run (``python benchmarks/bench_transformers_overhead.py``); on a
shared 2-core test machine a quick run's ratios are noise, so only gross regressions fail here.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_transformers_overhead.py"


def test_overhead_benchmark_quick_mode(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_transformers_overhead", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "transformers_overhead.json"
    threads = torch.get_num_threads()
    try:
        res = bench.main(["--quick", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    on_disk = json.loads(out.read_text())
    assert on_disk["ratio_median"] == res["ratio_median"]
    assert set(on_disk["step_ms"]) == {"baseline", "memwatch"}
    r = on_disk["ratio_median"]
    assert math.isfinite(r) and 0.2 < r < 5.0, on_disk
    assert len(on_disk["ratio_median_per_repeat"]) == on_disk["config"]["repeats"]
    assert on_disk["quick"] is True and on_disk["target_memwatch_ratio"] == 1.01
    # The hook itself: tens of microseconds at most even on a loaded machine.
    assert on_disk["memwatch_hook_us"]["median"] < 2000, on_disk["memwatch_hook_us"]
