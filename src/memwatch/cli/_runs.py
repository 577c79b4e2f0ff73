"""What the commands show of finished runs (``summary.json`` and ``report.html`` in an
``out_dir``; :mod:`memwatch.report.runs`): ``ls`` lists them beside bundles, ``inspect`` and
``report`` show them when a folder holds no bundle. A distributed job's ranks are one job: every
rank's current verdicts and rank 0's verdicts across ranks, one HTML report."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memwatch.core.errors import BundleError
from memwatch.core.safefs import read_bounded
from memwatch.report.html import render
from memwatch.report.runs import (
    FinishedJob,
    FinishedRun,
    find_runs,
    group_runs,
    job_data,
    job_lines,
    job_text,
    run_line,
    run_text,
)

__all__ = ["finished_html", "finished_json", "print_finished", "show_finished", "the_finished"]

#: The largest ``report.html`` a command copies (one memwatch writes is about 5 MB).
MAX_REPORT_BYTES = 64 << 20


def _finished(paths: Sequence[str | os.PathLike[str]]
              ) -> tuple[list[FinishedJob], list[FinishedRun], list[tuple[Path, BundleError]]]:
    runs, errors = find_runs(paths)
    jobs, rest = group_runs(runs)
    return jobs, rest, errors


def print_finished(paths: Sequence[str | os.PathLike[str]], where: str, lead: str = "") -> bool:
    """``memwatch ls``: the finished jobs and runs under ``paths`` (after ``lead``, when there
    are any; not bundles: a heading says so); whether there were any."""
    jobs, rest, errors = _finished(paths)
    if not (jobs or rest or errors):
        return False
    print(f"{lead}finished runs, not bundles (each run's summary.json and report.html; "
          f"`memwatch inspect {where}` and `memwatch report {where}` show the newest):")
    for job in jobs:
        for line in job_lines(job):
            print(f"  {line}")
    for run in rest:
        print(f"  run {run_line(run)}")
    for path, e in errors:
        print(f"  unreadable {path}  ({e})")
    return True


def _run_json(r: FinishedRun) -> dict[str, Any]:
    d = r.doc
    return {"out_dir": str(r.out_dir), "rank": r.rank, "world_size": r.world_size,
            "job": d.get("job"), "ended_utc": d.get("ended_utc"), "steps": d.get("steps"),
            "checks": d.get("checks"), "verdict": d.get("verdict"), "exit": d.get("exit"),
            "verdicts": r.verdicts, "rank_verdicts": r.rank_verdicts,
            "report": str(r.report) if r.report else None}


def finished_json(paths: Sequence[str | os.PathLike[str]]) -> dict[str, Any]:
    """``memwatch ls --json``'s finished jobs and runs."""
    jobs, rest, errors = _finished(paths)
    return {"finished_jobs": [{"id": j.id, "world_size": j.world_size, "ranks": j.ranks,
                               "missing_ranks": j.missing_ranks,
                               "runs": [_run_json(r) for r in j.runs]} for j in jobs],
            "finished_runs": [_run_json(r) for r in rest] + [
                {"path": str(p), "error": str(e)} for p, e in errors]}


def the_finished(paths: Sequence[str | os.PathLike[str]], where: str
                 ) -> FinishedJob | FinishedRun:
    """The newest finished job or run under ``paths``; BundleError when there is none."""
    jobs, rest, errors = _finished(paths)
    newest: list[tuple[float, FinishedJob | FinishedRun]] = [
        (max(r.ended for r in j.runs), j) for j in jobs] + [(r.ended, r) for r in rest]
    if not newest:
        why = f" ({errors[0][1]})" if errors else ""
        raise BundleError(f"{where}: no readable bundle and no finished run here{why} "
                          f"(`memwatch ls {where}` says what is there)")
    return max(newest, key=lambda x: x[0])[1]


def show_finished(paths: Sequence[str | os.PathLike[str]], where: str) -> int:
    """``memwatch inspect``: the newest finished job or run under ``paths``."""
    got = the_finished(paths, where)
    print(job_text(got) if isinstance(got, FinishedJob) else run_text(got), end="")
    return 0


def finished_html(paths: Sequence[str | os.PathLike[str]], where: str) -> str:
    """``memwatch report``: the job's one HTML report, or the run's own ``report.html``."""
    got = the_finished(paths, where)
    if isinstance(got, FinishedJob):
        print(f"memwatch: no bundle under {where}; shown: finished job {got.id} (ranks "
              f"{', '.join(map(str, got.ranks))})", file=sys.stderr)
        return render(job_data(got), with_charts=False)
    report = got.report
    if report is None:
        raise BundleError(f"{got.out_dir}: the run that ended there wrote no report.html "
                          "(run_report='none'); `memwatch inspect` shows its summary.json")
    print(f"memwatch: no bundle under {where}; shown: the run that ended there "
          f"({got.doc.get('ended_utc')}), {report}", file=sys.stderr)
    try:
        return read_bounded(report, MAX_REPORT_BYTES).decode("utf-8")
    except (OSError, UnicodeError) as e:
        raise BundleError(f"{report}: cannot read ({e})") from None
