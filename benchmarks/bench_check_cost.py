"""What checks inside epochs cost: one check on a process holding 3 million Python objects, and
the share of wall time the checks take in a 100,000-step run at the default cadence.

1. **A big heap.** A process holding 3 million live Python objects (lists: tracked by the garbage
   collector, so the census walks every one) runs a short loop under ``memwatch.watch(device=
   "cpu")`` with a check every 16 steps. Each check's cost is the duration of the ``mw.step()``
   that ran it, minus a median step. Three settings: ``census="auto"`` while the memory is flat
   (the census is skipped: the heap is over ``census_max_objects``), ``census="auto"`` while
   host memory grows (growth is suspected: the census runs anyway), and ``census="always"``.
2. **The 100,000-step run.** A real CPU training step (a small MLP, forward, backward, SGD) for
   100,000 optimizer steps of one epoch under ``memwatch.watch`` at the defaults
   (``check_every_n_steps=5000``, ``check_every_s=600``), beside the same run with checks off,
   in one process, alternating in blocks of 10,000 steps so that the machine's drift falls on
   both. Reported: the checks' summed time over the run's wall time (the goal is at most 1%),
   and the wall-time ratio of the two runs.

Prints a table and writes ``benchmarks/results/check_cost.json``. ``--quick``: 300,000 objects
and 20,000 steps (a smoke run, not the figures in the docs).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from benchmarks import _common  # noqa: E402

import memwatch  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "check_cost.json"


def _timed_steps(mw: memwatch.MemWatch, n: int, work: Any = None) -> tuple[list[float], list[int]]:
    """Run ``n`` steps; (every step() call's seconds, indexes of the calls that ran a check)."""
    times: list[float] = []
    checked: list[int] = []
    for i in range(n):
        if work is not None:
            work(i)
        before = mw.checks
        t0 = time.perf_counter()
        mw.step()
        times.append(time.perf_counter() - t0)
        if mw.checks != before:
            checked.append(i)
    return times, checked


def big_heap(n_objects: int) -> list[dict[str, Any]]:
    """One check's cost with ``n_objects`` live Python objects, per census setting."""
    held = [[i] for i in range(n_objects)]  # the user's heap: lists are GC-tracked
    grow: list[bytes] = []
    rows = []
    try:
        for label, census, growing in (("census auto, memory flat", "auto", False),
                                       ("census auto, memory growing", "auto", True),
                                       ("census always", "always", False)):
            grow.clear()
            gc.collect()
            with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
                    device="cpu", workers=False, out_dir=tmp, census=census,
                    check_every_n_steps=16, check_every_s=None, signals=False) as mw:

                # 1 MiB a step while growing: growth is suspected, the census runs.
                work = (lambda i: grow.append(b"x" * (1 << 20))) if growing else None
                censuses = 0
                last = None

                def counted(i: int, work: Any = work, mw: Any = mw) -> None:
                    nonlocal censuses, last
                    if work is not None:
                        work(i)
                    now = mw.analyzer.last_census_ms if mw.analyzer is not None else None
                    if now is not None and now != last:  # a new census ran at the last check
                        censuses += 1
                        last = now

                times, checked = _timed_steps(mw, 16 * 4 + 1, counted)
                times, checked = times[:-1], [i for i in checked if i < 16 * 4]
                step_med = statistics.median(t for i, t in enumerate(times) if i not in checked)
                costs = [(times[i] - step_med) * 1000.0 for i in checked]
                census_ms = mw.analyzer.last_census_ms if mw.analyzer is not None else None
                objects = len(gc.get_objects())
            rows.append({"setting": label, "objects": objects, "checks": len(costs),
                         "censuses": censuses,
                         "check_ms_median": statistics.median(costs),
                         "check_ms_max": max(costs), "last_census_ms": census_ms})
    finally:
        held.clear()
        grow.clear()
        gc.collect()
    return rows


def long_run(steps: int, block: int = 10_000) -> dict[str, Any]:
    """``steps`` steps at the default check cadence beside the same run with checks off."""
    train = _common.MlpStep()
    wall = {"defaults": 0.0, "checks off": 0.0}
    check_s: list[float] = []
    check_steps: list[int] = []
    step_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        on = memwatch.MemWatch(device="cpu", workers=False, out_dir=f"{tmp}/on", signals=False)
        off = memwatch.MemWatch(device="cpu", workers=False, out_dir=f"{tmp}/off",
                                signals=False, check_every_n_steps=None, check_every_s=None)
        on.start()
        off.start()
        try:
            done = 0
            while done < steps:
                n = min(block, steps - done)
                for label, mw in (("defaults", on), ("checks off", off)):
                    t0 = time.perf_counter()
                    times, checked = _timed_steps(mw, n, train)
                    wall[label] += time.perf_counter() - t0
                    if label == "defaults":
                        step_s.extend(times)
                        for i in checked:
                            check_s.append(times[i])
                            check_steps.append(done + i + 1)
                done += n
            checks = on.checks
        finally:
            on.close()
            off.close()
    med = statistics.median(step_s)
    extra = [max(t - med, 0.0) for t in check_s]
    return {"steps": steps, "checks": checks, "check_steps": check_steps,
            "check_ms": [round(t * 1000.0, 2) for t in extra],
            "check_ms_median": statistics.median(extra) * 1000.0 if extra else None,
            "checks_s_total": sum(extra), "wall_s": wall,
            "check_share": sum(extra) / wall["defaults"],
            "wall_ratio": wall["defaults"] / wall["checks off"],
            "step_ms_median": med * 1000.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller heap and run (smoke test)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    n_objects, steps = (300_000, 20_000) if args.quick else (3_000_000, 100_000)
    torch.set_num_threads(1)

    heap = big_heap(n_objects)
    print(f"One check with {n_objects:,} live Python objects (memwatch.watch(device='cpu'))")
    print(f"{'setting':<30} {'objects':>10} {'check ms (median)':>18} {'max':>8} "
          f"{'census ms':>10} {'censuses':>9}")
    for r in heap:
        cen = "-" if r["last_census_ms"] is None else f"{r['last_census_ms']:.0f}"
        print(f"{r['setting']:<30} {r['objects']:>10,} {r['check_ms_median']:>18.1f} "
              f"{r['check_ms_max']:>8.1f} {cen:>10} {r['censuses']:>4}/{r['checks']:<4}")

    run = long_run(steps)
    print()
    print(f"A {steps:,}-step run of one epoch at the defaults (a check every 5,000 steps or "
          "600 s), beside checks off")
    print(f"  checks: {run['checks']}, median {run['check_ms_median']:.1f} ms each, "
          f"{run['checks_s_total']:.2f} s in all")
    print(f"  median step {run['step_ms_median']:.3f} ms; wall {run['wall_s']['defaults']:.1f} s "
          f"(defaults) vs {run['wall_s']['checks off']:.1f} s (checks off): ratio "
          f"{run['wall_ratio']:.3f}")
    print(f"  checks' share of wall time: {100 * run['check_share']:.2f}% (goal <= 1%)")

    _common.write_results(args.out, args.quick, big_heap=heap, long_run=run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
