"""What the black box costs: bytes written per minute, time per rewrite, and ``mw.step()``.

1. **A rewrite at its largest**: a session whose record holds a full ring of snapshots (120, ten
   minutes at the default 5 s) and 20 findings; the median time of ``BlackBox.write()`` and the
   bytes of one record, so bytes per minute at the default cadence = bytes x 12.
2. **The hot path**: ``mw.step()`` (no training work, so memwatch's own cost is all there is)
   with the black box off, at the default 5 s, and at 1 s (as often as it can go: it is
   rewritten by the background sampler, once a second at the default ``interval_s``), in one
   process, alternating in blocks so drift falls on all three.
   The writer runs on its own thread; it takes the GIL while it serialises, so the median step
   should not move and the 99.9th percentile shows the rare step that waited for it.

Prints a table and writes ``benchmarks/results/blackbox.json``. ``--quick``: fewer steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import _common  # noqa: E402

import memwatch  # noqa: E402
from memwatch.core.findings import Finding  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "blackbox.json"


def rewrite_cost(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
            device="cpu", workers=False, out_dir=tmp, blackbox_every_s=3600.0) as mw:
        for _ in range(50):
            mw.step()
        mw.findings.extend(
            Finding(kind="leak", metric="host.rss", severity="warning",
                    message="x" * 400, evidence={"bytes_per_step": 1.0, "n": i})
            for i in range(20))
        bb = mw.blackbox
        assert bb is not None
        for _ in range(120):  # fill the ring of snapshots
            bb.document()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            bb.write()
            times.append(time.perf_counter() - t0)
        size = bb.last_bytes
    return {"rewrites": n, "ms_median": statistics.median(times) * 1e3,
            "ms_max": max(times) * 1e3, "bytes": size,
            "bytes_per_minute_at_5s": size * 12}


def _steps(mw: memwatch.MemWatch, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        mw.step()
        out.append(float(time.perf_counter_ns() - t0))
    return out


def hot_path(steps: int, block: int) -> dict[str, Any]:
    settings = {"off": None, "every 5 s": 5.0, "every 1 s": 1.0}
    ns: dict[str, list[float]] = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {k: memwatch.MemWatch(device="cpu", workers=False, out_dir=f"{tmp}/{i}",
                                         blackbox_every_s=v, check_every_n_steps=None,
                                         check_every_s=None, watchdog=False, signals=False)
                    for i, (k, v) in enumerate(settings.items())}
        for mw in sessions.values():
            mw.start()
        try:
            done = 0
            while done < steps:
                for k, mw in sessions.items():
                    ns[k].extend(_steps(mw, block))
                done += block
        finally:
            writes = {k: (mw.blackbox.writes if mw.blackbox else 0) for k, mw in sessions.items()}
            for mw in sessions.values():
                mw.close()
    out = {}
    for k, v in ns.items():
        v.sort()
        out[k] = {"steps": len(v), "ns_median": statistics.median(v),
                  "ns_p99": v[int(0.99 * (len(v) - 1))], "ns_p999": v[int(0.999 * (len(v) - 1))],
                  "rewrites": writes[k]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    rw = rewrite_cost(50 if args.quick else 300)
    hp = hot_path(*((60_000, 2_000) if args.quick else (600_000, 10_000)))
    print("One rewrite of a full record (120 snapshots, 20 findings)")
    print(f"  median {rw['ms_median']:.2f} ms (max {rw['ms_max']:.2f} ms), {rw['bytes']:,} bytes;"
          f" at the default 5 s: {rw['bytes_per_minute_at_5s'] / 1024:.0f} KiB written per "
          "minute")
    print()
    print(f"{'mw.step()':<16} {'steps':>9} {'median ns':>10} {'p99 ns':>9} {'p99.9 ns':>9} "
          f"{'rewrites':>9}")
    for k, r in hp.items():
        print(f"{k:<16} {r['steps']:>9,} {r['ns_median']:>10.0f} {r['ns_p99']:>9.0f} "
              f"{r['ns_p999']:>9.0f} {r['rewrites']:>9}")
    base = hp["off"]["ns_median"]
    print(f"median ratio, every 5 s / off: {hp['every 5 s']['ns_median'] / base:.3f}; "
          f"every 1 s / off: {hp['every 1 s']['ns_median'] / base:.3f}")
    _common.write_results(args.out, args.quick, rewrite=rw, hot_path=hp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
