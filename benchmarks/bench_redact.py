"""Redaction time against text size: linear, on ordinary and on adversarial texts.

``redact_text`` runs on every message, traceback and string that leaves the process, before any
truncation, at the moment an exception is on its way to user code: it must cost time linear in
the text, whatever the text is. For each input shape (a realistic traceback, one long random
token, runs of separators built to make a backtracking regex quadratic) and size (16 KiB to
4 MiB), the best of 3 runs in CPU time of the thread (a loaded machine's other jobs do not
count); the fitted exponent of time against size (log-log slope) says
linear (about 1) or quadratic (about 2).

``--baseline REF`` also times the ``redact.py`` of a git revision (e.g. the commit before issue
25) and this one side by side, on 4 to 32 KiB (a quadratic one takes minutes beyond).

Prints a table and writes ``benchmarks/results/redact.json``. ``--quick``: sizes up to 256 KiB.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from benchmarks import _common  # noqa: E402

from memwatch.core.redact import redact_text  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "redact.json"
KIB = 1024
SIZES = [16 * KIB, 64 * KIB, 256 * KIB, 1024 * KIB, 4096 * KIB]
BASE_SIZES = [4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB]
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_TB = ('  File "/home/alice/project/train.py", line {n}, in training_step\n'
       "    loss = model(batch)  # lr=0.001 step={n} cuda:0\n")


def _rep(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


SHAPES: dict[str, Callable[[int], str]] = {
    "traceback (realistic)": lambda n: "Traceback (most recent call last):\n" + "".join(
        _TB.format(n=i) for i in range(n // 100 + 1))[:n],
    "one random token": lambda n: "".join(random.Random(0).choices(_ALNUM, k=n)),
    "a=a=a=...": lambda n: _rep("a=", n),
    "x:x:x:...": lambda n: _rep("x:", n),
    "--a --a ...": lambda n: _rep("--a ", n),
    "'a': '...": lambda n: _rep("'a': '", n),
    "a://b:a://b:...": lambda n: _rep("a://b:", n),
    "Bearer Bearer ...": lambda n: _rep("Bearer ", n),
    "PEM END lines": lambda n: _rep("-----END RSA PRIVATE KEY-----\n", n),
}


def best_of(fn: Callable[[str], str], text: str, runs: int = 3,
            cap_s: float = 30.0) -> float | None:
    best = math.inf
    for _ in range(runs):
        t0 = time.thread_time()  # CPU time: other jobs on a shared box do not count
        fn(text)
        dt = time.thread_time() - t0
        best = min(best, dt)
        if dt > cap_s:
            return None if dt > 4 * cap_s else best
    return best


def slope(points: list[tuple[int, float]]) -> float | None:
    pts = [(math.log(n), math.log(t)) for n, t in points if t and t > 1e-5]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def _ms(t: float | None) -> float | None:
    return None if t is None else t * 1e3


def load_baseline(ref: str) -> Callable[[str], str]:
    src = subprocess.run(["git", "show", f"{ref}:src/memwatch/core/redact.py"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType("redact_baseline")
    exec(compile(src, f"{ref}:redact.py", "exec"), mod.__dict__)  # noqa: S102 - our own file
    return mod.__dict__["redact_text"]  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="sizes up to 256 KiB")
    ap.add_argument("--baseline", metavar="REF", help="also time redact.py of this git revision")
    ap.add_argument("--out", default=str(RESULTS), help="JSON results file")
    args = ap.parse_args(argv)
    sizes = [s for s in SIZES if not args.quick or s <= 256 * KIB]
    base = load_baseline(args.baseline) if args.baseline else None
    rows: list[dict[str, Any]] = []
    baseline_rows: list[tuple[str, dict[int, float | None], dict[int, float | None],
                              float | None]] = []
    print(f"{'input':22} " + " ".join(f"{s // KIB:>9} KiB" for s in sizes)
          + f" {'exponent':>9} {'us/KiB':>7}")
    for name, make in SHAPES.items():
        texts = {s: make(s) for s in sizes}
        times = {s: best_of(redact_text, texts[s]) for s in sizes}
        pts = [(s, t) for s, t in times.items() if t is not None]
        exp = slope(pts)
        last = times[sizes[-1]]
        per_kib = 1e6 * last / (sizes[-1] / KIB) if last is not None else None
        row: dict[str, Any] = {"input": name, "ms": {str(s): None if t is None else t * 1e3
                                                      for s, t in times.items()},
                               "exponent": exp, "us_per_kib_at_largest": per_kib}
        cells = " ".join(f"{t * 1e3:>10.1f}ms" if t is not None else f"{'-':>12}"
                         for t in times.values())
        print(f"{name:22} {cells} {exp if exp is not None else float('nan'):>9.2f} "
              f"{per_kib or float('nan'):>7.2f}")
        if base is not None:
            small = {s: make(s) for s in BASE_SIZES}
            btimes = {s: best_of(base, small[s], runs=1) for s in BASE_SIZES}
            ntimes = {s: best_of(redact_text, small[s]) for s in BASE_SIZES}
            row["baseline"] = {str(s): {"before_ms": _ms(btimes[s]), "after_ms": _ms(ntimes[s])}
                               for s in BASE_SIZES}
            row["baseline_exponent"] = slope([(s, t) for s, t in btimes.items()
                                              if t is not None])
            baseline_rows.append((name, btimes, ntimes, row["baseline_exponent"]))
        rows.append(row)
    if baseline_rows:
        print(f"\nside by side with {args.baseline} (before -> after, ms):")
        print(f"{'input':22} " + " ".join(f"{s // KIB:>17} KiB" for s in BASE_SIZES)
              + f" {'exponent before':>16}")
        for name, btimes, ntimes, bexp in baseline_rows:
            cells = " ".join(
                (f"{_ms(btimes[s]):>9.1f}" if btimes[s] is not None else f"{'>120 s':>9}")
                + f" -> {_ms(ntimes[s]) or 0.0:>6.2f}" for s in BASE_SIZES)
            print(f"{name:22} {cells} {bexp if bexp is not None else float('nan'):>16.2f}")
    worst = max((r["exponent"] for r in rows if r["exponent"] is not None), default=None)
    verdict = "PASS" if worst is not None and worst < 1.3 else "MISS"
    print(f"\nworst exponent {worst:.2f} (linear is 1, quadratic 2): {verdict}")
    doc = {"rows": rows, "sizes": sizes, "worst_exponent": worst, "verdict": verdict,
           "baseline": args.baseline, "meta": _common.platform_info(),
           "load_avg_1min": _common.load_avg_1min()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    main()
