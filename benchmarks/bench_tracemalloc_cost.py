"""Cost of ``MemWatch(tracemalloc=...)``: step time of a small CPU training loop, off vs on.

tracemalloc hooks every Python allocation: each one records a traceback of up to N frames and a
trace in a table. This measures what that costs a real (small) torch training loop, and what the
epoch-end snapshot and allocation-site diff cost:

1. **Loop.** The same loop (an MLP on random batches: forward, backward, SGD step, ``mw.step()``)
   under ``memwatch.watch(device="cpu")`` with ``tracemalloc`` off, 1 frame, 8 frames (the
   default for ``True``) and 16 frames. Variants are interleaved: every repeat runs each once,
   in a rotated order, so load from other processes hits them alike. Per variant: the median
   step time (over repeats, of each run's median), its ratio to "off" in the same repeat
   (median over repeats), the median ``end_epoch()`` time and, within it, the snapshot + diff.
2. **Per allocation.** Nanoseconds per allocation (200,000 floats kept, allocated 20 frames
   deep) with tracing off and at 1, 8 and 16 frames: the figure that carries over to other loops
   (cost ≈ Python allocations per step × this).
3. **Snapshot + grouping.** With N live traced blocks: ``take_snapshot()``, memwatch's grouping
   by traceback and by line
   (``memwatch.analysis.culprits.census.allocations.group_traces``), next to
   ``Snapshot.statistics("traceback")`` for comparison.

    python benchmarks/bench_tracemalloc_cost.py            # full run (about 1-2 min on 2 cores)
    python benchmarks/bench_tracemalloc_cost.py --quick    # smoke run (the test suite's)

Prints tables; writes ``benchmarks/results/tracemalloc_cost.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import memwatch
from memwatch.analysis.culprits.census.allocations import AllocationTracer, group_traces

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "tracemalloc_cost.json"
#: variant name -> tracemalloc option
VARIANTS: dict[str, bool | int] = {"off": False, "frames=1": 1, "frames=8 (True)": 8,
                                   "frames=16": 16}


# --------------------------------------------------------------------------- 1. the loop
def _loop(option: bool | int, epochs: int, steps: int, seed: int) -> dict[str, Any]:
    """One run of the training loop under memwatch; step times and epoch-end costs."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step_s: list[float] = []
    end_ms: list[float] = []
    snap_ms: list[float] = []
    gc_ms: list[float] = []
    clock = time.perf_counter
    with tempfile.TemporaryDirectory() as out, memwatch.watch(
        device="cpu", workers=False, out_dir=out, tracemalloc=option
    ) as mw:
        for _ in range(epochs):
            for i in range(steps):
                t0 = clock()
                x, y = torch.randn(32, 64), torch.randn(32, 1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                mw.step()
                if i >= 5:  # the first steps of a run warm caches up
                    step_s.append(clock() - t0)
            t0 = clock()
            mw.end_epoch()
            end_ms.append((clock() - t0) * 1000.0)
            tracer = mw._checker.tracer
            if tracer is not None and tracer.last is not None:
                snap_ms.append(tracer.last.elapsed_ms)
                gc_ms.append(tracer.last.gc_ms)
        overhead = tracemalloc.get_tracemalloc_memory() if tracemalloc.is_tracing() else 0
        disabled = dict(mw.disabled)
    return {"median_step_ms": statistics.median(step_s) * 1000.0,
            "p90_step_ms": sorted(step_s)[int(0.9 * (len(step_s) - 1))] * 1000.0,
            "end_epoch_ms": end_ms, "snapshot_diff_ms": snap_ms, "gc_collect_ms": gc_ms,
            "tracemalloc_memory_bytes": overhead, "disabled": disabled}


def bench_loop(repeats: int, epochs: int, steps: int) -> dict[str, Any]:
    names = list(VARIANTS)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    _loop(False, 1, 20, 0)  # warm-up: imports, first-use allocations
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {n: _loop(VARIANTS[n], epochs, steps, r) for n in order}
        for n in names:
            runs[n].append(got[n])
            ratios[n].append(got[n]["median_step_ms"] / got["off"]["median_step_ms"])
    out: dict[str, Any] = {}
    for n in names:
        rs = runs[n]
        # The first epoch end has no diff yet: the snapshot + diff figures are the later ones.
        snaps = [s for r in rs for s in r["snapshot_diff_ms"]]
        gcs = [s for r in rs for s in r["gc_collect_ms"]]
        ends = [e for r in rs for e in r["end_epoch_ms"][1:]]
        out[n] = {
            "tracemalloc": VARIANTS[n],
            "median_step_ms": statistics.median(r["median_step_ms"] for r in rs),
            "p90_step_ms": statistics.median(r["p90_step_ms"] for r in rs),
            "ratio_to_off": statistics.median(ratios[n]),
            "ratios": ratios[n],
            "end_epoch_ms": statistics.median(ends) if ends else None,
            "snapshot_diff_ms": statistics.median(snaps) if snaps else None,
            "gc_collect_ms": statistics.median(gcs) if gcs else None,
            "tracemalloc_memory_bytes": max(r["tracemalloc_memory_bytes"] for r in rs),
            "disabled": [r["disabled"] for r in rs if r["disabled"]],
        }
    return out


# --------------------------------------------------------------------------- 2. per allocation
def _deep(k: int, fn: Any) -> Any:
    return _deep(k - 1, fn) if k else fn()


def bench_per_allocation(n: int, repeats: int) -> dict[str, float]:
    def work() -> float:
        t0 = time.perf_counter()
        kept = [float(i) for i in range(n)]
        dt = time.perf_counter() - t0
        del kept
        return dt / n * 1e9

    out: dict[str, float] = {}
    for name, frames in (("off", 0), ("frames=1", 1), ("frames=8", 8), ("frames=16", 16)):
        if frames:
            tracemalloc.start(frames)
        try:
            out[name] = statistics.median(_deep(20, work) for _ in range(repeats))
        finally:
            if frames:
                tracemalloc.stop()
    return out


# --------------------------------------------------------------------------- 3. snapshot
def bench_snapshot(blocks: int, frames: int = 8) -> dict[str, Any]:
    """Snapshot and grouping with ``blocks`` live traced blocks (dicts of floats, 20 deep)."""
    per = 100  # floats per dict: a dict and its floats are 101 blocks

    def make() -> list[dict[int, float]]:
        return [{j: float(i * per + j) for j in range(per)} for i in range(blocks // (per + 1))]

    tracemalloc.start(frames)
    try:
        kept = _deep(20, make)
        gc.collect()
        t0 = time.perf_counter()
        snap = tracemalloc.take_snapshot()
        t1 = time.perf_counter()
        by_tb = group_traces(snap, "traceback")
        t2 = time.perf_counter()
        by_line = group_traces(snap, "lineno")
        t3 = time.perf_counter()
        stats = snap.statistics("traceback")
        t4 = time.perf_counter()
        traces = len(snap.traces)
        del snap, stats
        # memwatch's whole epoch-end step (gc.collect, snapshot, grouping by site, diff)
        tracer = AllocationTracer(frames).start()
        tracer.epoch_end(0, 0, None)
        kept.append({0: 0.0})
        t5 = time.perf_counter()
        diff = tracer.epoch_end(1, 1, None)
        t6 = time.perf_counter()
        gc_ms = diff.gc_ms if diff is not None else None
        tracer.close()
        del kept
    finally:
        tracemalloc.stop()
    return {"live_traces": traces, "frames": frames,
            "take_snapshot_ms": (t1 - t0) * 1000.0,
            "group_by_traceback_ms": (t2 - t1) * 1000.0,
            "group_by_line_ms": (t3 - t2) * 1000.0,
            "statistics_traceback_ms": (t4 - t3) * 1000.0,
            "memwatch_epoch_end_ms": (t6 - t5) * 1000.0, "of_which_gc_collect_ms": gc_ms,
            "groups_traceback": len(by_tb), "groups_line": len(by_line)}


# --------------------------------------------------------------------------- main
def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if tracemalloc.is_tracing():
        raise SystemExit("run without -X tracemalloc / PYTHONTRACEMALLOC: it measures tracing")
    import torch

    torch.set_num_threads(1)  # steadier timings on a shared box
    quick = args.quick
    repeats = args.repeats or (2 if quick else 5)
    epochs, steps = (2, 40) if quick else (3, 200)

    loop = bench_loop(repeats, epochs, steps)
    per_alloc = bench_per_allocation(50_000 if quick else 200_000, 3)
    snaps = [bench_snapshot(n) for n in ((20_000,) if quick else (20_000, 200_000, 1_000_000))]

    print(f"memwatch {memwatch.__version__}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs; loop: {epochs} epochs x {steps} "
          f"steps, {repeats} interleaved repeats")
    print(f"{'tracemalloc':18} {'step ms':>8} {'p90 ms':>8} {'x off':>7} {'end_epoch ms':>13} "
          f"{'snapshot+diff ms':>17} {'(gc.collect)':>13} {'tracemalloc MiB':>16}")
    for name, r in loop.items():
        print(f"{name:18} {r['median_step_ms']:8.3f} {r['p90_step_ms']:8.3f} "
              f"{r['ratio_to_off']:7.2f} {_fmt(r['end_epoch_ms'], '.0f'):>13} "
              f"{_fmt(r['snapshot_diff_ms'], '.0f'):>17} {_fmt(r['gc_collect_ms'], '.0f'):>13} "
              f"{r['tracemalloc_memory_bytes'] / 2**20:16.2f}")
    print()
    print("per allocation (floats kept, 20 frames deep): " + ", ".join(
        f"{k} {v:.0f} ns" for k, v in per_alloc.items()))
    print()
    print(f"{'live traces':>12} {'snapshot ms':>12} {'group tb ms':>12} {'group line ms':>14} "
          f"{'statistics() ms':>16} {'memwatch epoch end ms':>22} {'(gc.collect)':>13}")
    for s in snaps:
        print(f"{s['live_traces']:12,} {s['take_snapshot_ms']:12.1f} "
              f"{s['group_by_traceback_ms']:12.1f} {s['group_by_line_ms']:14.1f} "
              f"{s['statistics_traceback_ms']:16.1f} {s['memwatch_epoch_end_ms']:22.1f} "
              f"{_fmt(s['of_which_gc_collect_ms'], '.1f'):>13}")

    result = {
        "benchmark": "tracemalloc_cost",
        "quick": quick,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "load_avg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "memwatch": memwatch.__version__},
        "loop": {"epochs": epochs, "steps_per_epoch": steps, "repeats": repeats,
                 "model": "MLP 64-256-256-1, batch 32, SGD, torch threads 1",
                 "variants": loop},
        "per_allocation_ns": per_alloc,
        "snapshot": snaps,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
