"""What ``memwatch run`` costs a script: start-up time and step time, against the same script run
bare, side by side.

Each case runs the same script bare and under ``memwatch run`` (default options), alternating
(bare, watched, bare, watched, ...) so that machine load drifting over seconds hits both alike;
``--pairs`` pairs (at least 5 for the figures quoted in docs/run.md), medians reported.

* ``trivial``: ``print("hello")``, no torch. What every start pays: the ``memwatch run`` parent
  (an interpreter, ``import memwatch``, the options validated, ``exec``) and the shim in the
  child (it finds no torch, so nothing else happens).
* ``torch``: ``import torch`` and one optimizer step. Adds what a training script pays once:
  memwatch imported when torch is, the session started at the first step, the report written at
  exit (the default ``--report full``).
* ``steps``: a plain loop (an MLP 64-1024-1024-1, batch 64, one torch thread) that times each of
  its own steps; under ``memwatch run`` each ``optimizer.step()`` is one sample (torch's global
  optimizer step hook, then ``MemWatch.step()``). The ratio of median step times, per pair; the
  first step (the session starts inside it) separately.

    python benchmarks/bench_run_overhead.py                 # 7 pairs, 300 timed steps
    python benchmarks/bench_run_overhead.py --quick         # the trivial case, 2 pairs (tests)

Writes ``benchmarks/results/run_overhead.json`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _common  # noqa: E402

TRIVIAL = 'print("hello")\n'
TORCH = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    print("stepped")
""")
STEPS = textwrap.dedent("""
    import json, sys, time
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    warm, timed = int(sys.argv[1]), int(sys.argv[2])
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randn(64, 1)
    times = []
    for step in range(warm + timed):
        t0 = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"first_s": times[0], "steps_s": times[warm:]}))
""")


def _wall(cmd: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, proc.stdout


def _pairs(name: str, code: str, args: list[str], pairs: int, tmp: Path) -> list[dict[str, Any]]:
    script = tmp / f"{name}.py"
    script.write_text(code)
    py = sys.executable
    rows = []
    for i in range(pairs):
        row: dict[str, Any] = {}
        # Alternate which goes first, so neither always runs on a warmer page cache.
        order = ("bare", "watched") if i % 2 == 0 else ("watched", "bare")
        for which in order:
            cmd = [py, str(script), *args] if which == "bare" else \
                [py, "-m", "memwatch", "run", "--", py, str(script), *args]
            wall, out = _wall(cmd, tmp)
            row[f"{which}_s"] = wall
            row[f"{which}_out"] = out
        rows.append(row)
    return rows


def _startup(rows: list[dict[str, Any]]) -> dict[str, Any]:
    bare = statistics.median(r["bare_s"] for r in rows)
    watched = statistics.median(r["watched_s"] for r in rows)
    added = statistics.median(r["watched_s"] - r["bare_s"] for r in rows)
    return {"pairs": len(rows), "bare_median_s": bare, "watched_median_s": watched,
            "added_median_s": added,
            "pairs_s": [[round(r["bare_s"], 4), round(r["watched_s"], 4)] for r in rows]}


def _steps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios, first, bare_ms, watched_ms = [], [], [], []
    for r in rows:
        b, w = json.loads(r["bare_out"]), json.loads(r["watched_out"])
        mb, mw = statistics.median(b["steps_s"]), statistics.median(w["steps_s"])
        ratios.append(mw / mb)
        bare_ms.append(mb * 1e3)
        watched_ms.append(mw * 1e3)
        first.append((w["first_s"] - b["first_s"]) * 1e3)
    return {"pairs": len(rows), "timed_steps": len(json.loads(rows[0]["bare_out"])["steps_s"]),
            "bare_step_median_ms": statistics.median(bare_ms),
            "watched_step_median_ms": statistics.median(watched_ms),
            "ratio_median": statistics.median(ratios), "ratios": [round(x, 4) for x in ratios],
            "first_step_added_median_ms": statistics.median(first)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300, help="timed steps per run")
    ap.add_argument("--quick", action="store_true",
                    help="the trivial case only, 2 pairs (what the test suite runs)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "run_overhead.json"))
    args = ap.parse_args(argv)
    pairs = 2 if args.quick else max(args.pairs, 1)
    result: dict[str, Any] = {"benchmark": "run_overhead", "host": _common.host(),
                              "platform": _common.platform_info(), "quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="mw-run-bench-") as d:
        tmp = Path(d)
        result["trivial"] = _startup(_pairs("trivial", TRIVIAL, [], pairs, tmp))
        if not args.quick:
            result["torch"] = _startup(_pairs("torch_step", TORCH, [], pairs, tmp))
            result["steps"] = _steps(_pairs("loop", STEPS, ["20", str(args.steps)], pairs, tmp))
    result["host"]["load_avg_1min_end"] = _common.load_avg_1min()
    _print(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


def _print(r: dict[str, Any]) -> None:
    print(f"memwatch run overhead ({r['host']['cpus']} CPUs, load {r['host']['load_avg_1min']})")
    print(f"{'case':<34} {'bare':>10} {'watched':>10} {'added':>10}")
    for key, title in (("trivial", "start-up: print('hello')"),
                       ("torch", "start-up: import torch, 1 step")):
        s = r.get(key)
        if s:
            print(f"{title:<34} {s['bare_median_s']:>9.3f}s {s['watched_median_s']:>9.3f}s "
                  f"{s['added_median_s']:>+9.3f}s   ({s['pairs']} pairs, medians)")
    st = r.get("steps")
    if st:
        print(f"{'step (MLP 64-1024-1024-1, b=64)':<34} {st['bare_step_median_ms']:>8.3f}ms "
              f"{st['watched_step_median_ms']:>8.3f}ms   ratio {st['ratio_median']:.4f} "
              f"(per pair {min(st['ratios']):.4f}-{max(st['ratios']):.4f})")
        print(f"{'first step (session starts in it)':<34} {'':>10} {'':>10} "
              f"{st['first_step_added_median_ms']:>+8.1f}ms")


if __name__ == "__main__":
    main()
    os._exit(0)  # (nothing to wait for)
