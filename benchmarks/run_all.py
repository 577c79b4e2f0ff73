"""Run every ``benchmarks/bench_*.py``, each in its own interpreter, and summarise.

Each benchmark prints its own table and writes its JSON under ``benchmarks/results/``. A failing
benchmark does not stop the others; the exit status is non-zero if any failed. ``make bench``
runs this.

    python benchmarks/run_all.py                  # every benchmark
    python benchmarks/run_all.py hotpath own      # only those whose name contains a word
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    benches = sorted(HERE.glob("bench_*.py"))
    if argv:
        benches = [b for b in benches if any(word in b.stem for word in argv)]
    if not benches:
        print("no benchmark matched", argv, file=sys.stderr)
        return 2
    summary: list[tuple[str, int, float]] = []
    for bench in benches:
        print(f"\n=== {bench.name} ===", flush=True)
        t0 = time.monotonic()
        # Output streams straight through: long benchmarks show progress as they go.
        rc = subprocess.call([sys.executable, str(bench)], cwd=HERE.parent)
        summary.append((bench.name, rc, time.monotonic() - t0))
    print("\n=== summary ===")
    for name, rc, secs in summary:
        print(f"{name:40} {'ok' if rc == 0 else f'FAILED (exit {rc})':>16} {secs:8.1f} s")
    failed = [name for name, rc, _ in summary if rc != 0]
    if failed:
        print(f"{len(failed)} benchmark(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
