"""Verdicts under CPU load: busy-looping "burner" processes beside the detection corpus, and the
comparison of repeated runs (quiet and loaded) that ``bench_detection.py --load-study`` prints.

Not a benchmark on its own (``run_all.py`` runs ``bench_*.py`` only). A verdict that changes
with the machine's load is a bug: the study runs the corpus several times quiet and several
times beside N burners, interleaved (quiet, loaded, quiet, ...) so that drift of the shared
machine falls on both, and reports per scenario what each run said.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

#: What one burner runs: a pure-Python busy loop (one core's worth of runnable work).
BURN = "while True:\n    pass\n"


@contextlib.contextmanager
def burners(n: int) -> Iterator[list[int]]:
    """``n`` busy-looping processes for the duration of the block; yields their pids."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(max(0, n))]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            p.wait()


def outcome(row: dict[str, Any]) -> str:
    """What memwatch said about one scenario in one run, as a short comparable word: ``e1``
    (first leak verdict at the end of epoch 1), ``MISS``, ``quiet``, ``FALSE:<metrics>``."""
    if "error" in row:
        return "ERROR"
    d = row["memwatch"]
    if row["is_leak"]:
        return "MISS" if d["first_epoch"] is None else f"e{d['first_epoch']}"
    return "FALSE:" + ",".join(d["metrics"]) if d["false_alarm"] else "quiet"


def culprit_word(row: dict[str, Any]) -> str:
    if "error" in row or not row["is_leak"] or "culprit_ok" not in row["memwatch"]:
        return "-"
    return "yes" if row["memwatch"]["culprit_ok"] else "no"


def compare(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario and per condition, the outcome of every run; and the totals the issue asks
    for: false leak verdicts per condition, leaks found per run, scenarios whose outcome moved.

    ``runs``: ``{"condition": "quiet" | "burners", "rows": [...]}`` in the order they ran.
    """
    names = [r["name"] for r in runs[0]["rows"]]
    conditions = sorted({r["condition"] for r in runs}, key=["quiet", "burners"].index)
    table: dict[str, dict[str, list[str]]] = {n: {c: [] for c in conditions} for n in names}
    culprits: dict[str, dict[str, list[str]]] = {n: {c: [] for c in conditions} for n in names}
    per_run: list[dict[str, Any]] = []
    for run in runs:
        rows = {r["name"]: r for r in run["rows"]}
        false = [n for n, r in rows.items() if "error" not in r and not r["is_leak"]
                 and r["memwatch"]["false_alarm"]]
        found = sorted(n for n, r in rows.items() if "error" not in r and r["is_leak"]
                       and r["memwatch"]["detected"])
        per_run.append({"condition": run["condition"], "false_leak_verdicts": false,
                        "leaks_found": found, "wall_s": run.get("wall_s"),
                        "load_avg_1min": run.get("load_avg_1min")})
        for n in names:
            table[n][run["condition"]].append(outcome(rows[n]) if n in rows else "ERROR")
            culprits[n][run["condition"]].append(culprit_word(rows[n]) if n in rows else "-")
    moved = [n for n in names if len({o for c in conditions for o in table[n][c]}) > 1]
    culprit_moved = [n for n in names
                     if len({o for c in conditions for o in culprits[n][c]}) > 1]
    found_sets = {tuple(r["leaks_found"]) for r in per_run}
    totals = {c: {"runs": sum(1 for r in per_run if r["condition"] == c),
                  "false_leak_verdicts": sum(len(r["false_leak_verdicts"]) for r in per_run
                                             if r["condition"] == c),
                  "leaks_found_per_run": [len(r["leaks_found"]) for r in per_run
                                          if r["condition"] == c]}
              for c in conditions}
    return {"outcomes": table, "culprits": culprits, "runs": per_run, "totals": totals,
            "moved": moved, "culprit_moved": culprit_moved,
            "same_leaks_found": len(found_sets) == 1}


def print_comparison(cmp: dict[str, Any], n_burners: int) -> None:
    conditions = list(cmp["totals"])
    width = max(len(n) for n in cmp["outcomes"]) + 1
    head = f"{'scenario':<{width}} " + " | ".join(
        f"{c if c == 'quiet' else f'{n_burners} burners'} ({cmp['totals'][c]['runs']} runs)"
        for c in conditions)
    print(head)
    print("-" * max(len(head), 60))
    for name, by_c in cmp["outcomes"].items():
        mark = "  <- moved" if name in cmp["moved"] else ""
        print(f"{name:<{width}} " + " | ".join(" ".join(by_c[c]) for c in conditions) + mark)
    print("eN: first leak verdict at the end of epoch N; FALSE: leak verdict on a control "
          "(with its metrics); <- moved: not the same outcome in every run")
    print()
    for c in conditions:
        t = cmp["totals"][c]
        label = "quiet" if c == "quiet" else f"beside {n_burners} burners"
        print(f"{label:<22} false leak verdicts: {t['false_leak_verdicts']} in {t['runs']} "
              f"runs; leaks found per run: {t['leaks_found_per_run']}")
    print(f"same leaks found in every run: {'yes' if cmp['same_leaks_found'] else 'NO'}; "
          f"outcomes that moved: {', '.join(cmp['moved']) or 'none'}; culprits that moved: "
          f"{', '.join(cmp['culprit_moved']) or 'none'}")
