"""Memory held by memwatch itself over 1,000,000 ``step()`` calls.

A FakeDevice whose counters change every step (``set()``), the host probe, the background
sampler, and ``end_epoch()`` every 10,000 steps so epoch summaries accumulate (100 epochs). Python
allocations are traced with ``tracemalloc`` (numpy registers its array buffers with it too); the
bytes whose allocation traceback passes through memwatch's own source files are memwatch's.

Issue 2's targets: under 16 MiB, and no growth over the second half of the run (measured at 50%,
75% and 100%). The ring and the bucket builder are allocated once, up front, so nothing may grow
per step: the verdict is growth <= 1 byte per step (one float kept per step would be 16 bytes).
What does grow is one record per epoch (the compact epoch row, bounded by
``Timeline.max_epochs`` whose older rows are merged pairwise, and that epoch's findings); the
table reports it per epoch, with the source lines that hold it.

Prints a table and writes ``benchmarks/results/own_memory.json``. Exit status 0 unless the run
itself fails; the verdict is in the table and the JSON.

    python benchmarks/bench_own_memory.py               # 1,000,000 steps
    python benchmarks/bench_own_memory.py --steps 20000 --epoch-every 1000   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import memwatch
from memwatch.testing import FakeDevice

RESULTS = Path(__file__).resolve().parent / "results"
LIMIT = 16 << 20
MiB = float(1 << 20)


PKG = os.path.dirname(memwatch.__file__)


def memwatch_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes still allocated from inside memwatch's package (any frame of the traceback)."""
    return sum(by_memwatch_line(snapshot).values())


def by_memwatch_line(snapshot: tracemalloc.Snapshot) -> dict[str, int]:
    """Live bytes per memwatch source line: the innermost memwatch frame of each allocation."""
    out: dict[str, int] = {}
    for trace in snapshot.traces:
        for frame in reversed(trace.traceback):  # most recent call first
            if frame.filename.startswith(PKG):
                key = f"{os.path.relpath(frame.filename, PKG)}:{frame.lineno}"
                out[key] = out.get(key, 0) + trace.size
                break
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--epoch-every", type=int, default=10_000)
    ap.add_argument("--no-analyze", action="store_true",
                    help="leave the analyzer out (foundation only)")
    ap.add_argument("--depth", type=int, default=4, help="tracemalloc traceback depth")
    ap.add_argument("--json", type=Path, default=RESULTS / "own_memory.json")
    args = ap.parse_args(argv)
    steps, every = args.steps, args.epoch_every
    checkpoints = {steps // 2: "50%", steps * 3 // 4: "75%", steps: "100%"}

    # Deep enough tracebacks that numpy allocations made on memwatch's behalf (np.full runs in
    # numpy's own Python code) still show memwatch's frame; each frame kept costs time per
    # allocation, so no deeper than needed.
    tracemalloc.start(args.depth)
    t0 = time.monotonic()
    dev = FakeDevice(total_bytes=80 << 30)
    marks: list[dict[str, Any]] = []
    lines: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as out, memwatch.watch(
        device=dev, workers=False, out_dir=out, analyze=not args.no_analyze
    ) as mw:
        after_start = memwatch_bytes(tracemalloc.take_snapshot())
        assert mw.timeline is not None
        for i in range(1, steps + 1):
            # A slow leak with a sawtooth: the counters change every step.
            dev.set(allocated=(1 << 30) + i * 512 + (i % 7) * (1 << 20),
                    reserved=(2 << 30) + i * 512)
            mw.step()
            if i % every == 0:
                mw.end_epoch()
            if i in checkpoints:
                snap = tracemalloc.take_snapshot()
                lines[checkpoints[i]] = by_memwatch_line(snap)
                marks.append({
                    "at": checkpoints[i],
                    "step": i,
                    "memwatch_bytes": memwatch_bytes(snap),
                    "traced_current_bytes": tracemalloc.get_traced_memory()[0],
                    "timeline_nbytes": mw.timeline.nbytes(),
                    "epochs_kept": len(mw.timeline.epochs),
                    "elapsed_s": round(time.monotonic() - t0, 1),
                })
        analyzer = "off" if args.no_analyze else ("on" if mw.analyzer is not None else "absent")
        disabled = dict(mw.disabled)
    tracemalloc.stop()
    elapsed = time.monotonic() - t0

    half, last = marks[0], marks[-1]
    growth = last["memwatch_bytes"] - half["memwatch_bytes"]
    history_growth = last["timeline_nbytes"] - half["timeline_nbytes"]
    peak = max(m["memwatch_bytes"] for m in marks)
    under = peak < LIMIT
    # Nothing may grow per step: a single float kept per step would add 16 MiB over the second
    # half. What may grow is one record per epoch (the compact epoch row, the epoch's findings),
    # reported per epoch; Timeline.max_epochs bounds the rows.
    second_half_steps = last["step"] - half["step"]
    second_half_epochs = max(last["epochs_kept"] - half["epochs_kept"], 1)
    per_step = growth / second_half_steps
    per_epoch = growth / second_half_epochs
    no_growth = per_step <= 1.0
    print(f"memwatch {memwatch.__version__}: {steps:,} steps, end_epoch() every {every:,}, "
          f"analyzer {analyzer}, tracemalloc on; {elapsed:.0f} s")
    print(f"{'at':>5} {'step':>9} {'memwatch MiB':>13} {'traced MiB':>11} {'timeline MiB':>13} "
          f"{'epochs':>7} {'elapsed s':>10}")
    print(f"{'start':>5} {0:>9} {after_start / MiB:13.3f}")
    for m in marks:
        print(f"{m['at']:>5} {m['step']:>9,} {m['memwatch_bytes'] / MiB:13.3f} "
              f"{m['traced_current_bytes'] / MiB:11.3f} {m['timeline_nbytes'] / MiB:13.3f} "
              f"{m['epochs_kept']:>7} {m['elapsed_s']:>10}")
    print(f"peak held by memwatch {peak / MiB:.2f} MiB (limit 16 MiB): "
          f"{'PASS' if under else 'MISS'}")
    print(f"growth over the second half {growth / 1024:+.1f} KiB = {per_step:.3f} B/step "
          f"(limit 1 B/step): {'PASS' if no_growth else 'MISS'}; per epoch "
          f"{per_epoch / 1024:.2f} KiB (timeline arrays {history_growth / 1024:+.1f} KiB "
          "in all)")
    if disabled:
        print(f"components disabled during the run: {disabled}")
    grew = sorted(((lines["100%"].get(k, 0) - lines["50%"].get(k, 0), k)
                   for k in set(lines["50%"]) | set(lines["100%"])), reverse=True)
    grew = [(d, k) for d, k in grew if d > 0][:8]
    if grew:
        print("where memwatch's memory grew over the second half (innermost memwatch line):")
        for d, k in grew:
            print(f"  {d / 1024:+9.1f} KiB  {k}")

    result = {
        "benchmark": "own_memory",
        "steps": steps,
        "epoch_every": every,
        "analyzer": analyzer,
        "elapsed_s": round(elapsed, 1),
        "after_start_bytes": after_start,
        "marks": marks,
        "peak_bytes": peak,
        "limit_bytes": LIMIT,
        "second_half_growth_bytes": growth,
        "second_half_history_growth_bytes": history_growth,
        "second_half_growth_bytes_per_step": per_step,
        "second_half_growth_bytes_per_epoch": per_epoch,
        "verdict_limit": "PASS" if under else "MISS",
        "verdict_growth": "PASS" if no_growth else "MISS",
        "disabled": disabled,
        "second_half_growth_by_line": {k: d for d, k in grew},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.json)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
