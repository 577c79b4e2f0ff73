"""Fuzz every reader for longer than the tests do, and count what came out.

The property tests (``tests/test_fuzz_readers.py``) give each reader a few seconds of Hypothesis
examples in ``make test``. This runs the same cases (``tests/fuzz_artefacts.py``: mutated copies
of REAL artefacts of tiny real sessions) from seeds, ``--examples`` per reader: the bundle reader
and its renderers, the black-box record reader, the restricted unpickler of snapshots, and the
export reader of JSONL logs (with rotated files), CSV and JSON exports. Each input goes to the
in-process readers and then to ``memwatch inspect`` / ``ls`` / ``report`` in the same process.

Each reader runs in a child interpreter of its own (its peak RSS is that reader's memory bound)
with a time limit per example (``SIGALRM``: a read that blocks on a FIFO or spins is a hang, the
example is counted and the run goes on). An outcome is one of: ``result``, ``refused``
(the documented refusal: ``BundleError`` / ``MemwatchError`` / a one-line ``ValueError`` naming a
black-box record), ``crash`` (any other exception), ``hang``; the commands' exit codes are
counted, and so is any command that ended in the CLI's last resort or printed more than one line.
Prints a table and writes ``benchmarks/results/fuzz_readers.json``.

    python benchmarks/bench_fuzz_readers.py                    # 500 examples per reader
    python benchmarks/bench_fuzz_readers.py --examples 2000 --seed 7
    python benchmarks/bench_fuzz_readers.py --readers jsonl csv
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "fuzz_readers.json"
TESTS = REPO / "tests"
if str(TESTS) not in sys.path:  # the artefacts and mutations are the tests' own
    sys.path.insert(0, str(TESTS))
#: Seconds one example may take before it is a hang.
HANG_S = 30.0


class Hang(BaseException):
    """An example ran past :data:`HANG_S` (a BaseException: no reader's ``except Exception``
    swallows it)."""


def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang


def child(reader: str, artefacts: str, examples: int, seed: int) -> dict[str, Any]:
    """Run ``examples`` cases of ``reader`` in this process; returns its counts."""
    import fuzz_artefacts as fa
    from memwatch.cli import CAUGHT_MALFORMED

    art = fa.Artefacts(**{k: Path(v) for k, v in json.loads(artefacts).items()})
    outcomes: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    bad: list[dict[str, Any]] = []
    slowest = 0.0
    total = 0.0
    signal.signal(signal.SIGALRM, _alarm)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for i in range(examples):
        s = seed * 1_000_003 + i
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{reader}-") as tmp:
            work = Path(tmp)
            what = "?"
            t0 = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, HANG_S)
            try:
                c = fa.RandomChooser(s)
                try:
                    target, what = fa.make_case(reader, art, work, c)
                except Exception as e:  # noqa: BLE001 - the mutator's own failure
                    outcomes["mutator failed"] += 1
                    bad.append({"seed": s, "outcome": "mutator failed",
                                "detail": f"{type(e).__name__}: {e}"[:300]})
                    continue
                t0 = time.monotonic()
                outcome = fa.read(reader, target, work)
                for args in fa.cli_commands(reader, target, work, report=True):
                    before = sum(CAUGHT_MALFORMED.values())
                    try:
                        rc, _, _ = fa.run_cli(args)
                        codes[f"{args[0]} {rc}"] += 1
                    except AssertionError as e:  # the last resort, or not one line
                        kind = ("last resort" if sum(CAUGHT_MALFORMED.values()) != before
                                else "bad output")
                        codes[f"{args[0]} {kind}"] += 1
                        bad.append({"seed": s, "what": what, "command": args[0],
                                    "outcome": kind, "detail": str(e)[:300]})
            except Hang:
                outcome = "hang"
                bad.append({"seed": s, "what": what, "outcome": "hang"})
            except Exception as e:  # noqa: BLE001 - what this benchmark counts
                outcome = "crash"
                bad.append({"seed": s, "what": what, "outcome": "crash",
                            "detail": f"{type(e).__name__}: {e}"[:300],
                            "where": traceback.format_exc(limit=-3)[-600:]})
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.monotonic() - t0
            slowest = max(slowest, took)
            total += took
            outcomes[outcome] += 1
    return {"reader": reader, "examples": examples, "outcomes": dict(outcomes),
            "commands": dict(codes), "slowest_s": round(slowest, 3),
            "mean_ms": round(1000 * total / max(1, examples), 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rss_before_mib": round(base_rss, 1),
            "bad": bad[:50]}


def _parent(args: argparse.Namespace) -> int:
    import fuzz_artefacts as fa

    readers = args.readers or list(fa.READERS)
    rows: list[dict[str, Any]] = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-real-") as tmp:
        art = fa.make_artefacts(Path(tmp))
        spec = json.dumps({k: str(v) for k, v in vars(art).items()})
        for reader in readers:
            t0 = time.monotonic()
            cmd = [sys.executable, __file__, "--child", reader, "--artefacts", spec,
                   "--examples", str(args.examples), "--seed", str(args.seed)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.examples * HANG_S + 120)
                if proc.returncode != 0:
                    row = {"reader": reader, "examples": args.examples,
                           "outcomes": {"child died": 1}, "commands": {},
                           "bad": [{"outcome": f"exit {proc.returncode}",
                                    "detail": proc.stderr[-800:]}]}
                else:
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                row = {"reader": reader, "examples": args.examples,
                       "outcomes": {"hang (child killed)": 1}, "commands": {}, "bad": []}
            row["wall_s"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            print(f"{reader}: {row['outcomes']} in {row['wall_s']} s", flush=True)
    _table(rows)
    failures = sum(r["outcomes"].get(k, 0) for r in rows for k in r["outcomes"]
                   if k not in ("result", "refused", "mutator failed"))
    failures += sum(v for r in rows for k, v in r["commands"].items()
                    if k.endswith(("last resort", "bad output")))
    doc = {"examples_per_reader": args.examples, "seed": args.seed,
           "inputs": sum(r["examples"] for r in rows),
           "commands_run": sum(sum(r["commands"].values()) for r in rows),
           "crashes_hangs_last_resorts": failures, "wall_s": round(time.monotonic() - t_all, 1),
           "load_avg_1min": os.getloadavg()[0], "readers": rows}
    out = Path(args.json) if args.json else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"\n{doc['inputs']} inputs, {doc['commands_run']} commands; crashes, hangs and last "
          f"resorts: {failures}. Written to {out}")
    return 1 if failures else 0


def _table(rows: list[dict[str, Any]]) -> None:
    head = ("reader", "inputs", "result", "refused", "crash", "hang", "commands (exit codes)",
            "mean ms", "slowest s", "peak RSS MiB (before)")
    lines = [head]
    for r in rows:
        o = r["outcomes"]
        lines.append((r["reader"], str(r["examples"]), str(o.get("result", 0)),
                      str(o.get("refused", 0)), str(o.get("crash", 0)), str(o.get("hang", 0)),
                      ", ".join(f"{k}: {v}" for k, v in sorted(r["commands"].items())) or "-",
                      str(r.get("mean_ms", "-")), str(r.get("slowest_s", "-")),
                      f"{r.get('peak_rss_mib', '-')} ({r.get('rss_before_mib', '-')})"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    print()
    for line in lines:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(line)))
    for r in rows:
        for b in r.get("bad", [])[:5]:
            print(f"  {r['reader']}: {b}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=500, help="inputs per reader (500)")
    p.add_argument("--seed", type=int, default=44, help="first seed (44)")
    p.add_argument("--readers", nargs="*", help="only these readers")
    p.add_argument("--json", help=f"where to write the results (default {RESULTS})")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--artefacts", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.artefacts, args.examples, args.seed)))
        return 0
    return _parent(args)


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "offline")
    sys.exit(main())
