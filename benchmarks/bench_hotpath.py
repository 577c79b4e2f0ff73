"""Hot-path cost of ``MemWatch.step()``: median and p99 in microseconds.

Cases (issue 2's targets on this machine):

(a) ``device="cpu"`` + host probe                    median <= 10 us
(b) ``FakeDevice`` + host probe                      median <= 10 us
(c) host probe + 4 live DataLoader workers           median <= 15 us

Beside them, the floor: one bare ``os.pread`` of a kept-open ``/proc/self/statm`` (the one read the
host probe cannot avoid). Each call is timed on its own with ``perf_counter_ns``; the cost of the
timer pair itself (measured the same way around nothing) is subtracted, so the figures are the
call's own cost. The background sampler runs at its default interval, as in a real run.

Prints a table and writes ``benchmarks/results/hotpath.json``. Rows print PASS or MISS; the exit
status is 0 either way (a loaded machine must not fail a build over a timing).

    python benchmarks/bench_hotpath.py            # full run (~5 s here)
    python benchmarks/bench_hotpath.py --quick    # a smoke run (~3 s), used by the test suite
    python benchmarks/bench_hotpath.py --against ../old/src   # this tree against another one

``--against SRC`` times cases (a) and (b) side by side with another checkout's ``src`` (say the
previous main): child processes of each tree alternate for ``--rounds`` rounds on the same
machine, and the table gives each tree's median of the rounds' medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import memwatch
from memwatch.testing import FakeDevice

RESULTS = Path(__file__).resolve().parent / "results"


def _timer_overhead_ns(n: int) -> float:
    clock = time.perf_counter_ns
    samples = np.empty(n, dtype=np.int64)
    for i in range(n):
        t0 = clock()
        samples[i] = clock() - t0
    return float(np.median(samples))


def _time_calls(fn: Callable[[], object], n: int, warmup: int, overhead_ns: float) -> np.ndarray:
    """Per-call durations in microseconds, timer overhead removed."""
    clock = time.perf_counter_ns
    for _ in range(warmup):
        fn()
    samples = np.empty(n, dtype=np.int64)
    for i in range(n):
        t0 = clock()
        fn()
        samples[i] = clock() - t0
    return np.maximum(samples - overhead_ns, 0.0) / 1000.0


def _row(name: str, us: np.ndarray, target: float | None) -> dict[str, Any]:
    median = float(np.median(us))
    return {
        "case": name,
        "n": int(len(us)),
        "median_us": round(median, 3),
        "p99_us": round(float(np.percentile(us, 99)), 3),
        "mean_us": round(float(us.mean()), 3),
        "target_median_us": target,
        "verdict": None if target is None else ("PASS" if median <= target else "MISS"),
    }


def bench_floor(n: int, warmup: int, overhead: float) -> dict[str, Any]:
    fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    try:
        us = _time_calls(lambda: os.pread(fd, 128, 0), n, warmup, overhead)
    finally:
        os.close(fd)
    return _row("floor: os.pread(/proc/self/statm)", us, None)


def bench_session(name: str, target: float, n: int, warmup: int, overhead: float,
                  **kwargs: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out, memwatch.watch(out_dir=out, **kwargs) as mw:
        us = _time_calls(mw.step, n, warmup, overhead)
        keys = sorted(mw.latest())
    row = _row(name, us, target)
    row["metrics_per_step"] = len(keys)
    return row


class _Items:
    """A tiny map-style dataset (module level so it also works with the spawn start method)."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> int:
        return i


def bench_workers(n: int, warmup: int, overhead: float, workers: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    with warnings.catch_warnings():
        # torch warns when workers outnumber cores; 4 workers is the case the issue asks for.
        warnings.filterwarnings("ignore", message=".*worker processes in total")
        loader = DataLoader(_Items(), batch_size=8, num_workers=workers,  # type: ignore[arg-type]
                            persistent_workers=True)
        it = iter(loader)
    next(it)  # the workers are up and have filled their prefetch queues
    with tempfile.TemporaryDirectory() as out, memwatch.watch(
        device="cpu", out_dir=out
    ) as mw:
        deadline = time.monotonic() + 10
        while mw.latest().get("workers.count", 0.0) < workers and time.monotonic() < deadline:
            mw.step()  # until the background thread has found the workers
            time.sleep(0.05)
        seen = mw.latest().get("workers.count", 0.0)
        us = _time_calls(mw.step, n, warmup, overhead)
    del it
    row = _row(f"(c) host + {workers} live DataLoader workers", us, 15.0)
    row["workers_seen"] = int(seen)
    row["case"] += f" ({int(seen)} seen)"
    return row


SRC = Path(__file__).resolve().parent.parent / "src"


def _session_rows(n: int, warmup: int, overhead: float) -> list[dict[str, Any]]:
    return [
        bench_session("(a) device='cpu' + host", 3.0, n, warmup, overhead,
                      device="cpu", workers=False),
        bench_session("(b) FakeDevice + host", 5.0, n, warmup, overhead,
                      device=FakeDevice(total_bytes=16 << 30), workers=False),
    ]


def compare(other: Path, rounds: int, n: int, out: Path) -> int:
    """Cases (a) and (b) of this tree and of ``other`` (a ``src`` folder), alternating."""
    import subprocess

    trees = {"this": SRC, "other": other.resolve()}
    medians: dict[str, dict[str, list[float]]] = {k: {} for k in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, src in (trees.items() if r % 2 == 0 else reversed(trees.items())):
                res = Path(tmp) / f"{name}-{r}.json"
                env = {**os.environ, "PYTHONPATH": str(src)}
                subprocess.run([sys.executable, __file__, "--child", str(res), "-n", str(n)],
                               env=env, check=True)
                for row in json.loads(res.read_text()):
                    medians[name].setdefault(row["case"], []).append(row["median_us"])
    print(f"step() median, us: this tree ({SRC}) against {other}, {rounds} alternating rounds "
          f"of {n} calls (median of the rounds' medians)")
    print(f"{'case':32} {'this':>8} {'other':>8} {'ratio':>7}  target  verdict")
    rows = []
    for case, this in medians["this"].items():
        mine, theirs = float(np.median(this)), float(np.median(medians["other"][case]))
        target = 3.0 if case.startswith("(a)") else 5.0
        rows.append({"case": case, "this_us": this, "other_us": medians["other"][case],
                     "this_median_us": mine, "other_median_us": theirs,
                     "ratio": mine / theirs, "target_median_us": target})
        print(f"{case:32} {mine:8.2f} {theirs:8.2f} {mine / theirs:7.2f}  <= {target:g}  "
              f"{'PASS' if mine <= target else 'MISS'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "hotpath_compare", "other": str(other),
                               "rounds": rounds, "n": n, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("-n", type=int, default=None, help="timed calls per case")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--json", type=Path, default=RESULTS / "hotpath.json")
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout's src folder: time (a) and (b) side by side with it")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds for --against")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    n = args.n or (3_000 if args.quick else 100_000)
    warmup = max(n // 10, 500)
    if args.child is not None:  # one round of --against, in whichever tree PYTHONPATH names
        rows = _session_rows(n, warmup, _timer_overhead_ns(20_000))
        args.child.write_text(json.dumps(rows))
        return 0
    if args.against is not None:
        return compare(args.against, args.rounds, args.n or 30_000,
                       RESULTS / "hotpath_compare.json")

    overhead = _timer_overhead_ns(20_000)
    rows = [
        bench_floor(n, warmup, overhead),
        bench_session("(a) device='cpu' + host", 10.0, n, warmup, overhead,
                      device="cpu", workers=False),
        bench_session("(b) FakeDevice + host", 10.0, n, warmup, overhead,
                      device=FakeDevice(total_bytes=16 << 30), workers=False),
    ]
    try:
        rows.append(bench_workers(n, warmup, overhead, args.workers))
    except ImportError as e:  # torch missing: cases (a), (b) still stand
        print(f"(c) skipped: {e}", file=sys.stderr)

    floor = rows[0]["median_us"]
    print(f"memwatch {memwatch.__version__} step() hot path, {n} timed calls per case "
          f"(timer overhead {overhead:.0f} ns subtracted)")
    print(f"{'case':45} {'median us':>10} {'p99 us':>9} {'-floor':>8} {'target':>7}  verdict")
    for r in rows:
        target = "" if r["target_median_us"] is None else f"<= {r['target_median_us']:g}"
        above = "" if r is rows[0] else f"{r['median_us'] - floor:8.2f}"
        print(f"{r['case']:45} {r['median_us']:10.2f} {r['p99_us']:9.2f} {above:>8} "
              f"{target:>7}  {r['verdict'] or ''}")

    result = {
        "benchmark": "hotpath",
        "quick": args.quick,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "timer_overhead_ns": overhead,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.json)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
