"""The load study: does any verdict move with the machine's load? (issue 43)

Runs the whole detection corpus (the design and the held-out parts, through
``bench_detection.py``'s split mechanism: this script never names or opens a held-out scenario)
``--reps`` times quiet and ``--reps`` times beside ``--burners`` busy loops (default: as many
as there are cores), interleaved (quiet, loaded, quiet, ...) so that drift of a shared machine
falls on both conditions. Each scenario's *verdict* in one run is one word: when its leak was
first confirmed (``e1``: at the end of epoch 1; ``MISS``), or ``quiet``/``FALSE:<metrics>``
for a non-leak; then ``h+``/``h-`` where a holder is expected (named or not) and ``k+``/``k-``
where the reported corpus scores the kind. A scenario *flips* when its runs do not all give the
same word. The goal is 0 flips; a flip left is explained by evidence, not by a wider threshold.

    python benchmarks/bench_load_study.py                      # 3 + 3 runs, --quick, -j 1
    python benchmarks/bench_load_study.py --reps 1 --only leak_slow --only ctrl_clean

Prints the flips (scenario, its word in each run) and writes
``benchmarks/results/load_study.json`` (every scenario's words, each run's wall time and load,
and each scenario's trail: what memwatch said at each epoch's check, the evidence a flip is
placed from).
The full study takes 40-60 minutes on a 2-core machine (42+ scenarios one at a time, six times).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import _common, _load, bench_detection, scenarios  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "load_study.json"
CONDITIONS = ("quiet", "loaded")


def selected(only: Sequence[str] | None, split: str) -> list[str]:
    """The scenarios' names: ``whole`` is the design corpus then the held-out part (their
    names only: the held-out modules are loaded by the child processes that run them)."""
    base = (list(scenarios.NAMES) + list(scenarios.HELDOUT) if split == "whole"
            else list(scenarios.split_names(split)))
    return [n for n in base if n in only] if only else base


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def verdict(row: dict[str, Any]) -> str:
    """One scenario's verdict in one run, as a word comparable across runs."""
    word = _load.outcome(row)
    if "error" in row:
        return word
    culprit = _load.culprit_word(row)
    if culprit != "-":
        word += " h+" if culprit == "yes" else " h-"
    kind = (row.get("reported_score") or {}).get("kind")
    if kind is not None:
        word += " k+" if kind else " k-"
    return word


def trail(raw: dict[str, Any]) -> list[list[str]]:
    """What memwatch said at each epoch's check of one run, compactly (``rule:kind:metric``
    and the finding's belief where it has one): the evidence a flip is placed from (a leak
    confirmed at the first check in one run and called retention in another)."""
    out = []
    for fs in raw.get("findings") or []:
        words = []
        for f in fs if isinstance(fs, list) else []:
            if not isinstance(f, dict):
                continue
            belief = (f.get("evidence") or {}).get("belief_state")
            words.append(":".join(str(f.get(k, "")) for k in ("rule", "kind", "metric"))
                         + (f"={belief}" if belief and belief != f.get("kind") else ""))
        out.append(words)
    return out


def flips(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Per scenario, its words by condition (in run order); only the scenarios that flipped."""
    words: dict[str, dict[str, list[str]]] = {}
    for run in runs:
        for name, word in run["verdicts"].items():
            words.setdefault(name, {c: [] for c in CONDITIONS})[run["condition"]].append(word)
    return {n: w for n, w in words.items() if len({x for ws in w.values() for x in ws}) > 1}


def print_flips(flipped: dict[str, dict[str, list[str]]], n_scenarios: int, reps: int,
                burners: int) -> None:
    print(f"\nflips: {len(flipped)} of {n_scenarios} scenarios "
          f"({reps} runs quiet, {reps} beside {burners} busy loops)")
    if not flipped:
        return
    width = max(len(n) for n in flipped) + 1
    print(f"{'scenario':<{width}} quiet | {burners} busy loops")
    for name, by_c in sorted(flipped.items()):
        print(f"{name:<{width}} " + " | ".join(", ".join(by_c[c]) for c in CONDITIONS))
    print("eN: first leak verdict at the end of epoch N; FALSE: a leak verdict on a non-leak; "
          "h+/h-: holder named or not; k+/k-: the reported corpus's kind right or not")


def study(names: list[str] | None, reps: int, burners: int, quick: bool, jobs: int,
          check_every: int | None) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for i in range(reps):
        for condition, n in (("quiet", 0), ("loaded", burners)):
            print(f"run {i + 1}/{reps}, {condition}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            with _load.burners(n):
                raw = bench_detection.run_corpus(names, quick=quick, jobs=jobs,
                                                 check_every=check_every)
                load = _common.load_avg_1min()
                load = None if load is None else round(load, 2)
            rows, summary = bench_detection.score(raw)
            runs.append({"condition": condition, "burners": n,
                         "wall_s": round(time.perf_counter() - t0, 1), "load_avg_1min": load,
                         "verdicts": {r["name"]: verdict(r) for r in rows},
                         "errors": {r["name"]: r["error"][-400:] for r in rows if "error" in r},
                         "trails": {n: trail(r) for n, r in raw.items() if "error" not in r},
                         "summary": summary})
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="runs per condition (default 3)")
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2,
                    help="busy loops beside the loaded runs (default: the number of cores)")
    ap.add_argument("--split", choices=("whole", *scenarios.SPLITS, "all"), default="whole",
                    help="whole (default): the design corpus and the held-out part; design, "
                         "heldout, all: those parts of the reported corpus only")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="only these scenarios (repeatable; within --split)")
    ap.add_argument("--full", action="store_true", help="full sizes (default: --quick sizes)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="scenarios at once (default 1)")
    ap.add_argument("--check-every", type=int, default=None, metavar="N",
                    help="also a check every N steps inside epochs")
    ap.add_argument("--out", default=str(RESULTS), help="where the JSON goes")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.burners < 1 or args.jobs < 1:
        ap.error("--reps, --burners and --jobs must be at least 1")
    names = selected(args.only, args.split)
    if not names:
        ap.error(f"no scenario selected: --only must name scenarios of the {args.split} part "
                 "(see bench_detection.py --list --split ...)")
    t0 = time.perf_counter()
    runs = study(names, args.reps, args.burners, not args.full, args.jobs, args.check_every)
    total = time.perf_counter() - t0
    flipped = flips(runs)
    print_flips(flipped, len(names), args.reps, args.burners)
    for run in runs:
        print(f"{run['condition']:<7} {run['wall_s']:7.1f} s, load average "
              f"{run['load_avg_1min']}, errors: {len(run['errors'])}")
    print(f"total wall time: {total:.1f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    meta = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": _commit(), "quick": not args.full, "jobs": args.jobs,
            "total_wall_s": round(total, 1), "reps": args.reps, "burners": args.burners,
            "split": args.split, "check_every": args.check_every, "scenarios": len(names),
            **_common.platform_info()}
    tmp.write_text(json.dumps({"meta": meta, "flips": flipped, "runs": runs}, indent=1,
                              default=str))
    os.replace(tmp, out)
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
