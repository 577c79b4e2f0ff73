"""What checks sized to the run (``check_every_n_steps="auto"``) cost a long run, and what they give
a short one, against the fixed 5,000-step cadence every run had before.

1. **A long run.** A real CPU training step (a small MLP: forward, backward, SGD) for 100,000
   optimizer steps of one epoch under ``memwatch.watch(device="cpu")``, once with
   ``check_every_n_steps=5000`` (before) and once at the default ``"auto"`` (after), both with
   ``check_every_s=600``, alternating in blocks of 10,000 steps so that the machine's drift falls
   on both. Reported: the checks run (the last word at the close included), their steps, and
   their CPU time: the training thread's CPU time of each ``mw.step()`` that ran a check, less
   the median step's.
2. **A short run.** The loop of issue 42: 1,200 steps that keep ~100 KiB a step in a dict keyed
   by step. Reported, before and after: the checks while it ran, the last word, and whether the
   run's current verdict is a leak naming the dict.

Prints a table and writes ``benchmarks/results/check_cadence.json``. ``--quick``: 20,000 steps
(a smoke run, not the figures in the docs).
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

import torch  # noqa: E402
from benchmarks import _common  # noqa: E402

import memwatch  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "check_cadence.json"
SETTINGS = (("before: every 5,000 steps", 5000), ("after: auto", "auto"))


def long_run(steps: int, block: int = 10_000) -> dict[str, Any]:
    """Both cadences on the same run, alternating blocks; each one's checks and their CPU."""
    train = _common.MlpStep()
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {label: memwatch.MemWatch(device="cpu", workers=False, signals=False,
                                             out_dir=f"{tmp}/{i}", check_every_n_steps=every,
                                             run_report="none", warn=False)
                    for i, (label, every) in enumerate(SETTINGS)}
        cpu: dict[str, list[float]] = {label: [] for label in sessions}
        check_cpu: dict[str, list[float]] = {label: [] for label in sessions}
        at: dict[str, list[int]] = {label: [] for label in sessions}
        for mw in sessions.values():
            mw.start()
        done = 0
        while done < steps:
            n = min(block, steps - done)
            for label, mw in sessions.items():
                for _ in range(n):
                    train()
                    before = mw.checks
                    c0 = time.thread_time()
                    mw.step()
                    spent = time.thread_time() - c0
                    cpu[label].append(spent)
                    if mw.checks != before:
                        check_cpu[label].append(spent)
                        at[label].append(mw.step_count)
            done += n
        for label, mw in sessions.items():
            c0 = time.thread_time()
            mw.close()  # the last word
            last = time.thread_time() - c0
            med = statistics.median(cpu[label])
            extra = [max(t - med, 0.0) for t in check_cpu[label]]
            out[label] = {"checks": mw.checks, "check_steps": at[label],
                          "checks_cpu_s": sum(extra), "close_cpu_s": last,
                          "step_cpu_ms_median": med * 1000.0}
    return out


_SHORT = """
import json, sys, tempfile
sys.path.insert(0, {repo!r})
import torch, memwatch
from benchmarks import _common
torch.set_num_threads(1)
train, cache = _common.MlpStep(), {{}}
with tempfile.TemporaryDirectory() as tmp:
    with memwatch.watch(device="cpu", workers=False, signals=False, out_dir=tmp,
                        check_every_n_steps={every!r}, run_report="none", warn=False) as mw:
        for step in range(1200):
            train()
            cache[step] = bytearray(100 * 1024)
            mw.step()
        running = mw.checks
leak = [f for f in mw.current_findings() if f.kind == "leak"]
print(json.dumps({{"checks_while_running": running, "checks": mw.checks, "leak": bool(leak),
                  "held_by": leak[-1].culprit if leak else None,
                  "said_at_step": leak[-1].step if leak else None}}))
"""


def short_run() -> dict[str, Any]:
    """The 1,200-step leaking loop under both cadences, each in a fresh process (a process
    that already held and freed that much memory would refill its free heap first: RSS would
    not move)."""
    import json
    import subprocess

    out: dict[str, Any] = {}
    for label, every in SETTINGS:
        code = _SHORT.format(repo=str(REPO), every=every)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=600)
        out[label] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 20,000-step run (smoke test)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    steps = 20_000 if args.quick else 100_000
    torch.set_num_threads(1)

    run = long_run(steps)
    print(f"A {steps:,}-step run of one epoch (a small MLP's CPU step), check_every_s=600")
    print(f"{'cadence':<28} {'checks':>6} {'checks CPU s':>13} {'close CPU s':>12}  steps")
    for label, r in run.items():
        shown = ", ".join(f"{s:,}" for s in r["check_steps"][:9])
        print(f"{label:<28} {r['checks']:>6} {r['checks_cpu_s']:>13.3f} "
              f"{r['close_cpu_s']:>12.3f}  {shown}{' ...' if len(r['check_steps']) > 9 else ''}")
    short = short_run()
    print()
    print("The 1,200-step loop that keeps ~100 KiB a step in a dict")
    for label, r in short.items():
        print(f"{label:<28} checks while running {r['checks_while_running']}, with the last word "
              f"{r['checks']}; leak: {r['leak']} (at step {r['said_at_step']}); held by: "
              f"{r['held_by']}")
    _common.write_results(args.out, args.quick, long_run=run, short_run=short)
    return 0


if __name__ == "__main__":
    sys.exit(main())
