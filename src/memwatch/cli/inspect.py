"""Summarise a bundle, or compare the ranks of a distributed job, in the terminal.

FILE (a black-box record, ``<out_dir>/blackbox/...json``): how a run that left no bundle ended
(SIGKILL, the kernel's OOM killer), its last samples and findings.

BUNDLE: what ran out, how full memory was, the largest live tensors and what held them, the
analyzer's findings, the allocator's segments (from the snapshot, read with a restricted unpickler
that never runs code) and the last minutes of the timeline.

DIR (an output directory; several DIRs, such as the out_dirs of a job's nodes, are read as one):
for the bundles of several ranks of one job, as ``memwatch ls`` groups them, which rank failed
first, on which host, when and why, and every rank's memory at that moment (the last sample each
rank's own bundle holds from before it; for a rank without a bundle, its peaks at the last epoch
end as rank 0 recorded them); ranks whose collective failed because that rank died are said to
be so. With several jobs under DIR the newest is shown; ``--job ID`` picks another. A folder of
single-process bundles shows its newest bundle. A folder without bundles shows what the run that
ended there left (its ``summary.json``: its current verdicts with their holders, how it ended,
where its report is), or, for the ranks of a finished distributed job, every rank's verdicts and
rank 0's verdicts across ranks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memwatch.bundle import open_bundle
from memwatch.bundle.blackbox import BLACKBOX_SUBDIR, ENDED_SUBDIR, judge, read_record, summary_line
from memwatch.bundle.documents import segments_summary
from memwatch.cli._base import Command
from memwatch.cli._paths import choose_job, is_output_dir, joined, non_negative_int
from memwatch.cli._runs import show_finished
from memwatch.core.errors import BundleError, MemwatchError
from memwatch.core.units import fmt_bytes
from memwatch.report.gather import gather
from memwatch.report.jobs import compare, group_jobs, render_comparison
from memwatch.report.summary import summarize
from memwatch.report.terminal import print_summary
from memwatch.report.text import shorten


class InspectCommand(Command):
    """Print a terminal summary of BUNDLE (what ran out, how full, who held it, findings), or
    compare the ranks of the job whose bundles are under DIR."""

    name = "inspect"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", metavar="BUNDLE|DIR",
                            help="a bundle directory, or a directory of several ranks' bundles; "
                                 "several DIRs (the out_dirs of a job's nodes) are read as one")
        parser.add_argument("--job", metavar="ID",
                            help="with DIR: the job to compare (an id `memwatch ls DIR` shows)")
        parser.add_argument("--rows", type=non_negative_int, default=12,
                            help="timeline rows to show (default 12; 0 for none)")
        parser.add_argument("--format", choices=("auto", "rich", "plain"), default="auto",
                            help="auto (default): rich tables on a terminal when rich is "
                                 "installed, plain text otherwise")

    def run(self, args: argparse.Namespace) -> int:
        paths = [Path(x) for x in args.paths]
        if len(paths) > 1:
            return self._dir(paths, args)
        p = paths[0]
        if p.is_file() and p.suffix == ".json" and p.parent.name in (BLACKBOX_SUBDIR,
                                                                      ENDED_SUBDIR):
            return _blackbox(p, args.rows)
        if is_output_dir(p):
            return self._dir(paths, args)
        if args.job:
            raise BundleError(f"--job is for a directory of bundles; {p} is one bundle")
        return self._one(p, args)

    def _one(self, path: Path, args: argparse.Namespace) -> int:
        bundle = open_bundle(path)
        summary = summarize(bundle)
        snap = bundle.snapshot()  # validates the pickle too: a bad one exits 2
        seg = segments_summary(snap)
        extra = ""
        if seg is not None:
            extra = (f"\nAllocator snapshot: {seg['segments']} segments, "
                     f"{fmt_bytes(seg['reserved_bytes'])} reserved, "
                     f"{fmt_bytes(seg['allocated_bytes'])} allocated, largest free block "
                     f"{fmt_bytes(seg['largest_free_block_bytes'])}\n")
        try:
            print_summary(summary, tail_rows=args.rows, fmt=args.format, extra=extra)
        except ImportError as e:  # --format rich without rich: one line, exit code 2
            raise MemwatchError(str(e)) from None
        return 0

    def _dir(self, paths: list[Path], args: argparse.Namespace) -> int:
        want: str | None = args.job
        d = joined(paths)
        jobs, rest = group_jobs(gather(paths).entries)
        job = choose_job(jobs, want, d)
        if job is None:
            good = [path for path, b in rest if not isinstance(b, BundleError)]
            if not good:  # a finished run or job left its summary.json there
                return show_finished(paths, d)
            # An output folder of single-process runs: the newest bundle is the one wanted.
            print(f"memwatch: {len(good)} bundle(s) under {d}; the newest is shown "
                  f"(`memwatch ls {d}` lists them)\n")
            return self._one(good[-1], args)
        print(render_comparison(compare(job)), end="")
        if want is None and len(jobs) > 1:
            others = ", ".join(j.label for j in jobs[:-1])
            print(f"\n{len(jobs) - 1} older job(s) under {d}: {others} (--job ID to compare one)")
        return 0


_COLUMNS = ("host.rss", "workers.uss", "cgroup.working_set", "cgroup.limit", "system.available")


def _blackbox(path: Path, rows: int) -> int:
    """The story a black-box record tells: how the run ended, its last samples, its findings."""
    try:
        doc = read_record(path)
    except ValueError as e:
        raise BundleError(str(e)) from None
    end = judge(doc)
    print(f"memwatch black box {path}")
    print(f"  {summary_line(doc, end)}")
    print(f"  why: {end.get('why')}")
    samples = doc.get("samples") or []
    cols = [c for c in _COLUMNS if any(c in (s.get("values") or {}) for s in samples)]
    if samples and rows > 0:
        print(f"\nLast {min(rows, len(samples))} of {len(samples)} records (one per rewrite):")
        t_end = float(samples[-1].get("t") or 0.0)
        print(f"  {'t (s)':>8} {'step':>8} " + " ".join(f"{c:>19}" for c in cols))
        for s in samples[-rows:]:
            vals = s.get("values") or {}
            cells = " ".join(f"{fmt_bytes(vals[c]) if c in vals else '-':>19}" for c in cols)
            print(f"  {float(s.get('t') or 0.0) - t_end:>8.1f} {s.get('step')!s:>8} {cells}")
    findings = doc.get("findings") or []
    print(f"\nFindings ({len(findings)}):" if findings else "\nNo findings.")
    for f in findings:
        print(f"  [{f.get('severity')}] {f.get('kind')} {f.get('metric')}: "
              f"{shorten(f.get('message'), 160)}")
    return 0
