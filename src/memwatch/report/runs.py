"""Finished runs, read from what they left in their ``out_dir``s: ``summary.json`` and
``report.html`` (:mod:`memwatch.bundle.run_summary`), for ``memwatch ls``, ``inspect`` and
``report`` of a folder that holds no bundle, or beside its bundles.

A run of one process is one :class:`FinishedRun`. The ranks of a distributed job (one
``out_dir`` per rank, ``run/rank0``, ``run/rank1``..., or several ``out_dir``s named together)
that share a job id are one :class:`FinishedJob`: every rank's current verdicts, and rank 0's
verdicts across ranks (a rank that leaks and the others do not, a rank that stopped answering).

Example::

    >>> from pathlib import Path
    >>> from memwatch.bundle.run_summary import write_summary
    >>> from memwatch.report.runs import find_runs, run_line
    >>> _ = write_summary(Path(tmp), {"steps": 1200, "checks": 4, "verdict": "ok",
    ...                               "verdicts": [], "rank": 0, "world_size": 1})
    >>> runs, errors = find_runs([tmp])
    >>> run_line(runs[0]).split()[4:8]
    ['1,200', 'steps,', '4', 'checks;']
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memwatch.bundle.paths import REPORT_FILE
from memwatch.bundle.run_summary import SUMMARY_FILE, read_summary
from memwatch.core.errors import BundleError
from memwatch.report.data import ReportData, finite
from memwatch.report.gather import gather
from memwatch.report.text import shorten

__all__ = ["FinishedJob", "FinishedRun", "find_runs", "group_runs", "job_data", "job_lines",
           "job_text", "run_line", "run_text", "verdict_line"]

@dataclasses.dataclass
class FinishedRun:
    """What one finished session left: its ``summary.json`` (read and validated)."""

    out_dir: Path
    doc: dict[str, Any]

    @property
    def rank(self) -> int:
        r = self.doc.get("rank")
        return r if isinstance(r, int) else 0

    @property
    def world_size(self) -> int:
        w = self.doc.get("world_size")
        return w if isinstance(w, int) and w > 0 else 1

    @property
    def job_id(self) -> str | None:
        job = self.doc.get("job")
        jid = job.get("id") if isinstance(job, dict) else None
        return str(jid) if jid else None

    @property
    def ended(self) -> float:
        t = finite(self.doc.get("ended_unix"))
        return t if t is not None else 0.0

    @property
    def report(self) -> Path | None:
        """Its ``report.html``, when it wrote one and it is still there."""
        p = self.out_dir / REPORT_FILE
        try:
            return p if self.doc.get("report") and stat.S_ISREG(os.lstat(p).st_mode) else None
        except OSError:
            return None

    @property
    def verdicts(self) -> list[dict[str, Any]]:
        return [v for v in self.doc.get("verdicts") or [] if isinstance(v, dict)]

    @property
    def rank_verdicts(self) -> list[dict[str, Any]]:
        return [v for v in self.doc.get("rank_verdicts") or [] if isinstance(v, dict)]


@dataclasses.dataclass
class FinishedJob:
    """The finished runs of one distributed job, by rank."""

    id: str
    world_size: int
    runs: list[FinishedRun]

    @property
    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.runs})

    @property
    def missing_ranks(self) -> list[int]:
        have = set(self.ranks)
        return [r for r in range(self.world_size) if r not in have]

    @property
    def rank0(self) -> FinishedRun | None:
        return next((r for r in self.runs if r.rank == 0), None)


def find_runs(paths: Iterable[str | os.PathLike[str]]
              ) -> tuple[list[FinishedRun], list[tuple[Path, BundleError]]]:
    """The finished runs under ``paths`` (the ``out_dir``s :func:`memwatch.report.gather.gather`
    finds there holding a ``summary.json``), oldest first, and the ``summary.json`` files that
    cannot be read (each with its one-line reason)."""
    runs: list[FinishedRun] = []
    errors: list[tuple[Path, BundleError]] = []
    for d in gather(paths).out_dirs:
        try:
            if not stat.S_ISREG(os.lstat(d / SUMMARY_FILE).st_mode):
                continue
        except OSError:
            continue
        try:
            runs.append(FinishedRun(d, read_summary(d / SUMMARY_FILE)))
        except BundleError as e:
            errors.append((d / SUMMARY_FILE, e))
    runs.sort(key=lambda r: (r.ended, str(r.out_dir)))
    return runs, errors


def group_runs(runs: list[FinishedRun]) -> tuple[list[FinishedJob], list[FinishedRun]]:
    """The runs of distributed jobs (world size above 1, one job id) and the rest."""
    groups: dict[str, list[FinishedRun]] = {}
    rest: list[FinishedRun] = []
    for r in runs:
        jid = r.job_id
        if r.world_size > 1 and jid:
            groups.setdefault(jid, []).append(r)
        else:
            rest.append(r)
    jobs = []
    for jid, rs in groups.items():
        latest: dict[int, FinishedRun] = {}
        for r in rs:  # a rank's out_dir holds its newest run only; several copies: the newest
            if r.rank not in latest or r.ended >= latest[r.rank].ended:
                latest[r.rank] = r
        kept = sorted(latest.values(), key=lambda r: r.rank)
        jobs.append(FinishedJob(jid, max(r.world_size for r in kept), kept))
    jobs.sort(key=lambda j: max(r.ended for r in j.runs))
    return jobs, rest


# --------------------------------------------------------------------------- words
def _utc(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ending(doc: dict[str, Any]) -> str:
    got = doc.get("exit")
    end: dict[str, Any] = got if isinstance(got, dict) else {}
    status = str(end.get("status") or "?")
    if end.get("exception"):
        status += f" ({end['exception']})"
    return status


def _steps(doc: dict[str, Any]) -> str:
    steps, checks = doc.get("steps"), doc.get("checks")
    out = f"{steps:,} steps" if isinstance(steps, int) else "? steps"
    if isinstance(doc.get("epochs"), int):
        out += f" ({doc['epochs']} epochs)"
    return out + f", {checks if isinstance(checks, int) else '?'} checks"


def verdict_line(v: dict[str, Any]) -> str:
    """One current verdict: ``warning leak in host.rss, held by train.cache: +100 KiB/step``."""
    from memwatch.core.units import fmt_bytes

    text = f"{v.get('severity')} {v.get('kind')} in {v.get('metric')}"
    if v.get("stage") not in (None, "train"):
        text += f" ({v['stage']} loop)"
    holder = v.get("holder") or (str(v.get("culprit") or "").split(" — ")[0] or None)
    if holder:
        text += f", held by {shorten(str(holder), 80)}"
    rate = finite(v.get("bytes_per_step"))
    if rate:
        text += f": {'+' if rate > 0 else ''}{fmt_bytes(rate)}/step"
    steps = finite(v.get("steps_to_oom"))
    if steps is not None and v.get("severity") != "info":
        text += f", out of memory in ~{steps:,.0f} steps"
    return text


def run_line(run: FinishedRun) -> str:
    """The run in one line, as ``memwatch ls`` lists it."""
    d = run.doc
    return (f"{_utc(run.ended)[:19]}  rank {run.rank}  {_steps(d)}; {d.get('verdict', '?')}; "
            f"{_ending(d)}  {run.out_dir}")


def _run_block(run: FinishedRun, indent: str = "  ") -> list[str]:
    out = [f"{indent}{verdict_line(v)}" for v in run.verdicts if _counts(v)]
    return out or [f"{indent}no leak, no warning"]


def _counts(v: dict[str, Any]) -> bool:
    from memwatch.core.verdict_words import counts

    return counts(v)


def run_text(run: FinishedRun) -> str:
    """``memwatch inspect`` of a finished run: its verdicts, how it ended, where its report is."""
    d = run.doc
    lines = [f"memwatch run in {run.out_dir}: ended {_utc(run.ended)}, {_ending(d)}",
             f"  {_steps(d)}; host {d.get('host', '?')}, pid {d.get('pid', '?')}"
             + (f", rank {run.rank} of {run.world_size}" if run.world_size > 1 else ""), "",
             f"Verdict: {d.get('verdict', '?')}"]
    lines += _run_block(run)
    for v in run.verdicts:
        if _counts(v) and v.get("suggestions"):
            lines.append(f"  fix ({v.get('kind')} in {v.get('metric')}): "
                         f"{shorten(str(v['suggestions'][0]), 300)}")
    bundles = [b for b in d.get("bundles") or [] if isinstance(b, dict)]
    if bundles:
        lines += ["", "Bundles it wrote:"] + [
            f"  {b.get('trigger')} ({b.get('classification') or '-'}): "
            f"{run.out_dir / str(b.get('path'))}" for b in bundles]
    lines.append("")
    lines.append(f"Report: {run.report}" if run.report else "No report.html was written.")
    return "\n".join(lines) + "\n"


def job_lines(job: FinishedJob) -> list[str]:
    """The finished job, as ``memwatch ls`` lists it: one heading, one line per rank."""
    zero = job.rank0
    across = zero.rank_verdicts if zero is not None else []
    head = (f"finished job {job.id}: world size {job.world_size}, summaries from rank(s) "
            f"{', '.join(map(str, job.ranks))}"
            + (f", none from rank(s) {', '.join(map(str, job.missing_ranks))}"
               if job.missing_ranks else ""))
    lines = [head]
    lines += [f"  {run_line(r)}" for r in job.runs]
    lines += [f"  across ranks (rank 0): {verdict_line(v)}" for v in across if _counts(v)]
    return lines


def job_text(job: FinishedJob) -> str:
    """``memwatch inspect`` of a finished job: every rank's current verdicts, then rank 0's
    verdicts across ranks."""
    lines = [f"memwatch job {job.id}: world size {job.world_size}, finished; summaries from "
             f"rank(s) {', '.join(map(str, job.ranks))}"]
    if job.missing_ranks:
        lines.append(f"  no summary from rank(s) {', '.join(map(str, job.missing_ranks))}: "
                     "killed before it could close, or its out_dir was not named")
    lines.append("")
    for r in job.runs:
        lines.append(f"Rank {r.rank} ({r.doc.get('host', '?')}, pid {r.doc.get('pid', '?')}): "
                     f"{_steps(r.doc)}; {_ending(r.doc)}; {r.doc.get('verdict', '?')}")
        lines += _run_block(r, "  ")
    zero = job.rank0
    across = [v for v in (zero.rank_verdicts if zero is not None else []) if _counts(v)]
    lines.append("")
    lines.append("Across ranks (rank 0's verdicts): " + ("none" if not across else ""))
    lines += [f"  {verdict_line(v)}" for v in across]
    reports = [f"  rank {r.rank}: {r.report}" for r in job.runs if r.report is not None]
    if reports:
        lines += ["", "Each rank's report:"] + reports
    return "\n".join(lines) + "\n"


def job_data(job: FinishedJob) -> ReportData:
    """The job's one HTML report: every rank's current verdicts as cards (each with its rank),
    rank 0's verdicts across ranks, a line per rank, and where each rank's own report is."""
    d = ReportData(title=f"memwatch job {job.id}", source="finished job")
    d.has_epochs = any(isinstance(r.doc.get("epochs"), int) for r in job.runs)
    d.meta = [("world size", str(job.world_size)),
              ("ranks", ", ".join(map(str, job.ranks))),
              ("ended", _utc(max(r.ended for r in job.runs)))]
    current: list[dict[str, Any]] = []
    for r in job.runs:
        for v in r.verdicts + r.rank_verdicts:
            current.append({**v, "rank": v.get("rank") if v.get("rank") is not None
                            else r.rank})
    d.current = current
    d.findings = list(current)
    worst = [r for r in job.runs if r.doc.get("verdict") not in (None, "ok")]
    d.headline = ("Every rank ended without a leak or a warning." if not worst else
                  "; ".join(f"rank {r.rank}: {r.doc.get('verdict')}" for r in worst))
    for r in job.runs:
        d.notes.append(f"Rank {r.rank}: {_steps(r.doc)}; {_ending(r.doc)}; "
                       + (f"its report: {r.report}" if r.report else "no report.html"))
    if job.missing_ranks:
        d.notes.append(f"No summary from rank(s) {', '.join(map(str, job.missing_ranks))}: "
                       "killed before it could close, or its out_dir was not named.")
    for r in job.runs:
        for k, v in (r.doc.get("limits") or {}).items():
            if isinstance(v, (int, float)):
                d.limits.setdefault(str(k), float(v))
    return d
