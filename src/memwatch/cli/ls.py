"""List what runs left: bundles (time, rank, trigger, classification, size, and why a broken one
cannot be read) and finished runs (their ``summary.json``: steps, checks, verdict, how they
ended), each under its own heading.

DIR is a memwatch output directory (the one given as ``out_dir``), its ``oom/`` subdirectory, or
a folder holding one ``out_dir`` per rank or per node (``run/rank0``, ``gathered/node1/rank3``).
Several DIRs are read as one: the out_dirs of a job's nodes, each on its own disk, are named
together (``memwatch ls /mnt/node0/run /mnt/node1/run``). Without DIR,
``./memwatch`` (memwatch's default ``out_dir``) is listed when it holds memwatch output (bundles,
``oom/``, ``blackbox/``); otherwise the command says so and exits with code 2.
Bundles of several ranks of one distributed job are listed together under a job heading that says
which rank, on which host, failed first (``memwatch inspect DIR`` compares them); bundles of
single-process runs follow. Then the runs whose black box (``<out_dir>/blackbox/``) says they
ended without a clean close (SIGKILL, the kernel's OOM killer) or are still running. ``--json``
prints the same as one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memwatch.bundle import Bundle
from memwatch.bundle.blackbox import find_records, judge, summary_line
from memwatch.cli._base import Command
from memwatch.cli._paths import default_out_dir, joined
from memwatch.cli._runs import finished_json, print_finished
from memwatch.core.errors import BundleError
from memwatch.core.units import fmt_bytes
from memwatch.report.gather import gather
from memwatch.report.jobs import LATE_TRIGGERS, Job, group_jobs

_HEAD = f"{'time (UTC)':<26} {'rank':>4} {'trigger':<13} {'class':<12} {'size':>10}  bundle"


def _row(path: Path, b: Bundle | BundleError, indent: str = "") -> str:
    if isinstance(b, Bundle):
        m = b.manifest
        cls = m.get("classification") or "-"
        rank = m.get("rank")
        rank_s = "-" if rank is None else str(rank)  # as --json says it
        return (f"{indent}{str(m.get('created_utc', '?')):<26} {rank_s:>4} "
                f"{str(m.get('trigger', '?')):<13} {str(cls):<12} {fmt_bytes(m.get('bytes')):>10}"
                f"  {path}")
    return f"{indent}{'?':<26} {'':>4} {'unreadable':<13} {'-':<12} {'':>10}  {path}  ({b})"


def _job_heading(job: Job) -> str:
    first = job.first_failure()
    missing = job.missing_ranks
    what = first.classification or first.trigger
    hosts = job.hosts
    return (f"job {job.label}: world size {job.world_size}, {len(job.bundles)} bundle(s) from "
            f"rank(s) {', '.join(map(str, job.ranks))}"
            + (f" on {len(hosts)} hosts ({', '.join(hosts)})" if len(hosts) > 1 else "")
            + (f", none from rank(s) {', '.join(map(str, missing))}" if missing else "")
            + (f"; rank {first.rank}{f' on {first.host}' if len(hosts) > 1 else ''} failed "
               f"first ({what})"
               if first.is_own_failure or first.trigger in LATE_TRIGGERS
               else f"; no rank's own failure recorded, first: rank {first.rank}'s collective "
               f"lost a peer ({what})" if first.is_failure
               else f"; no failure, first bundle: rank {first.rank} ({first.trigger})"))


def _entry_json(path: Path, b: Bundle | BundleError) -> dict[str, Any]:
    if not isinstance(b, Bundle):
        return {"path": str(path), "error": str(b)}
    m = b.manifest
    return {"path": str(path), "created_utc": m.get("created_utc"), "rank": m.get("rank"),
            "world_size": m.get("world_size"), "host": m.get("host"), "node": m.get("node"),
            "trigger": m.get("trigger"),
            "classification": m.get("classification"), "bytes": m.get("bytes"),
            "job": m.get("job")}


def _records(out_dirs: list[Path]) -> list[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """Black-box records of every out_dir found."""
    return [(path, doc, judge(doc)) for d in out_dirs for path, doc in find_records(d)]


def _print_records(recs: list[tuple[Path, dict[str, Any], dict[str, Any]]]) -> None:
    print("runs by their black box (`memwatch inspect FILE` tells the story):")
    for path, doc, end in recs:
        print(f"  {summary_line(doc, end)}")
        print(f"    {end.get('why')}; {path}")


class LsCommand(Command):
    """List the bundles under DIR (default ./memwatch), grouped by job, oldest first, and the
    finished runs (summary.json)."""

    name = "ls"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dirs", nargs="*", default=None, metavar="DIR",
                            help="output directory, its oom/ folder, or a folder of per-rank or "
                                 "per-node output directories; several DIRs are read as one job's "
                                 "(default: ./memwatch, when it holds memwatch output)")
        parser.add_argument("--json", action="store_true",
                            help="print one JSON document instead of a table")

    def run(self, args: argparse.Namespace) -> int:
        dirs = list(args.dirs) or [default_out_dir(self.name)]
        where = joined(dirs)
        found = gather(dirs)
        entries = found.entries
        jobs, rest = group_jobs(entries)
        recs = _records(found.out_dirs)
        if args.json:
            doc: dict[str, Any] = {
                "jobs": [{"id": j.id, "attempt": j.attempt, "source": j.source,
                          "world_size": j.world_size, "ranks": j.ranks, "hosts": j.hosts,
                          "missing_ranks": j.missing_ranks,
                          "first_failure": {"rank": j.first_failure().rank,
                                            "host": j.first_failure().host,
                                            "path": str(j.first_failure().path)},
                          "bundles": [_entry_json(rb.path, rb.bundle) for rb in j.bundles]}
                         for j in jobs],
                "bundles": [_entry_json(p, b) for p, b in rest],
                "runs": [{"path": str(p), "pid": doc.get("pid"), "host": doc.get("host"),
                          "step": doc.get("step"), "end": end} for p, doc, end in recs],
                **finished_json(dirs),
            }
            print(json.dumps(doc, indent=1))
            return 0
        if not entries:
            print(f"no bundles under {where}")
            print_finished(dirs, where, lead="\n")
            if recs:
                print()
                _print_records(recs)
            return 0
        for job in jobs:
            print(_job_heading(job))
            print("  " + _HEAD)
            for rb in job.bundles:
                print(_row(rb.path, rb.bundle, "  "))
            print()
        if rest:
            if jobs:
                print("other bundles:")
            print(_HEAD)
            for path, b in rest:
                print(_row(path, b), file=sys.stdout)
        if jobs:
            print(("\n" if rest else "") + f"`memwatch inspect {where}` compares the ranks of "
                  + ("the newest job" if len(jobs) > 1 else "the job")
                  + " at the moment the first one failed.")
        print_finished(dirs, where, lead="\n")
        if recs:
            print()
            _print_records(recs)
        return 0
