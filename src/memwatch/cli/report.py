"""Write a self-contained HTML report (one file, opens offline: plotly.js is inlined).

SOURCE is a bundle directory, a JSONL/CSV export of samples (``.jsonl``, ``.json``, ``.csv``), or
one or more output directories (``out_dir``s, as ``memwatch inspect`` takes them: the out_dirs of
a job's nodes, or a folder they were gathered into). Output directories holding a distributed
job's bundles give one report of the whole job (:mod:`memwatch.report.job_report`: who failed
first, every rank's verdicts and series; the newest job, or ``--job ID``); otherwise the newest
bundle's report (a line on stderr says which). Output directories without bundles give the
report of the run that ended there (the ``report.html`` it wrote when it closed), or one report
of a finished distributed job (every rank's current verdicts and rank 0's verdicts across
ranks). Charts need the ``report`` extra (``pip install
'memwatch[report]'``); without it the report has its tables and says what is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from memwatch.bundle import Bundle, open_bundle
from memwatch.cli._base import Command
from memwatch.cli._paths import choose_job, is_output_dir, joined, pick_bundle
from memwatch.cli._runs import finished_html
from memwatch.core.errors import BundleError, MemwatchError
from memwatch.report.exports import from_export
from memwatch.report.gather import gather
from memwatch.report.html import render, render_bundle_html, write_html
from memwatch.report.job_report import render_job_html
from memwatch.report.jobs import group_jobs

_EXPORT_SUFFIXES = (".jsonl", ".json", ".csv")


class ReportCommand(Command):
    """Render SOURCE (a bundle, an output directory or a JSONL/CSV export) as one offline HTML
    file."""

    name = "report"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("sources", nargs="+", metavar="SOURCE",
                            help="a bundle directory, a .jsonl/.csv export of samples, or "
                                 "output directories (a distributed job's: one report of the "
                                 "job; else the newest bundle)")
        parser.add_argument("--job", metavar="ID",
                            help="with output directories: the job to report (an id `memwatch "
                                 "ls DIR` shows)")
        parser.add_argument("-o", "--output", default="report.html",
                            help="output file (default: report.html)")

    def run(self, args: argparse.Namespace) -> int:
        srcs: list[str] = list(args.sources)
        src = srcs[0]
        out = Path(args.output)
        if out.is_dir():
            raise MemwatchError(f"-o {out} is a directory; name a file, e.g. "
                                f"-o {out / 'report.html'}")
        try:
            if (len(srcs) == 1 and src.lower().endswith(_EXPORT_SUFFIXES)
                    and not os.path.isdir(src)):
                # (a FIFO or a device named like an export is refused by the reader)
                html = render(from_export(src))
            elif len(srcs) > 1 or is_output_dir(Path(src)):
                html = _from_dirs(srcs, args.job)
            else:
                if args.job:
                    raise BundleError(f"--job is for output directories; {src} is one bundle")
                bundle = open_bundle(src)
                bundle.snapshot()  # refuse a bundle whose snapshot is not a plain pickle
                html = render_bundle_html(bundle)
        except OSError as e:  # reading SOURCE
            raise MemwatchError(f"cannot read {e.filename or src}: {e.strerror or e}") from None
        try:
            print(write_html(html, out))  # atomic: a reader never sees half a report
        except OSError as e:
            raise MemwatchError(f"cannot write {e.filename or out}: {e.strerror or e} "
                                "(choose another -o path)") from None
        return 0


def _from_dirs(srcs: list[str], want: str | None) -> str:
    """The report of output directories: the job's (newest, or ``want``), else a bundle's."""
    where = joined(srcs)
    jobs, _ = group_jobs(gather(srcs).entries)
    job = choose_job(jobs, want, where)
    if job is not None:
        print(f"memwatch: job {job.label}, {len(job.bundles)} bundle(s) from rank(s) "
              f"{', '.join(map(str, job.ranks))} under {where}", file=sys.stderr)
        return render_job_html(job, where)
    if not any(isinstance(b, Bundle) for _, b in gather(srcs).entries):
        return finished_html(srcs, where)  # the run that ended there, or the finished job
    picked, line = pick_bundle(srcs)
    print(line, file=sys.stderr)
    bundle = open_bundle(picked)
    bundle.snapshot()
    return render_bundle_html(bundle)
