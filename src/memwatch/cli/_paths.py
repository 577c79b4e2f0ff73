"""Which folders hold memwatch output, and the default ``out_dir`` the commands may take.

``./memwatch`` is memwatch's default ``out_dir``, but a folder of that name is just as often
something else (a clone of this repository): it is taken as the default only when it holds what a
run writes there — a bundle (its ``manifest.json``, or a writer's ``.tmp-`` folder), the ``oom/``
or ``end_of_run/`` folder, a black box (``blackbox/``), a finished run's ``summary.json``, or
per-rank or per-node ``out_dir``s holding those (:func:`memwatch.report.gather.holds_output`).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

from memwatch.core.errors import BundleError
from memwatch.report.gather import gather, holds_output, is_bundle
from memwatch.report.jobs import Job, group_jobs

__all__ = ["DEFAULT_OUT_DIR", "choose_job", "default_out_dir", "holds_output", "is_output_dir",
           "joined", "non_negative_int", "pick_bundle"]

#: ``MemWatch(out_dir=...)``'s default, relative to the working directory.
DEFAULT_OUT_DIR = "memwatch"


def joined(paths: Sequence[str | Path]) -> str:
    """The paths as a command line takes them (for the hints the commands print)."""
    return " ".join(shlex.quote(str(p)) for p in paths)


def is_output_dir(d: Path) -> bool:
    """A folder of bundles (an ``out_dir``, its ``oom/``, per-rank ``out_dir``s), not a bundle."""
    return d.is_dir() and not is_bundle(d) and holds_output(d)


def choose_job(jobs: Sequence[Job], want: str | None, where: str) -> Job | None:
    """The job ``--job`` names (a one-line error, exit 2, when there is none of that id), else
    the newest; None when there is no job and none was asked for."""
    if want is None:
        return jobs[-1] if jobs else None
    picked = [j for j in jobs if want in (j.id, j.label)]
    if not picked:
        known = ", ".join(j.label for j in jobs) or "none"
        raise BundleError(f"{where}: no job {want!r} (jobs there: {known})")
    return picked[0]


def pick_bundle(paths: Sequence[str | Path]) -> tuple[Path, str]:
    """The bundle a command shows for the folders ``paths``, and one line saying which and why:
    the first failure of the newest distributed job when there is one, else the newest bundle."""
    where = joined(paths)
    entries = gather(paths).entries
    good = [path for path, b in entries if not isinstance(b, BundleError)]
    if not good:
        raise BundleError(f"{where}: no readable bundle here (`memwatch ls {where}` says why)")
    jobs, _ = group_jobs(entries)
    if jobs:
        first = jobs[-1].first_failure()
        return first.path, (f"memwatch: {len(good)} bundle(s) under {where}; shown: job "
                            f"{jobs[-1].label}, rank {first.rank} ({first.trigger}), {first.path}")
    return good[-1], (f"memwatch: {len(good)} bundle(s) under {where}; shown: the newest, "
                      f"{good[-1]} (`memwatch ls {where}` lists them)")


def default_out_dir(command: str) -> str:
    """``./memwatch`` when it holds memwatch output; else one line (exit code 2) saying so."""
    d = Path(DEFAULT_OUT_DIR)
    if holds_output(d):
        return DEFAULT_OUT_DIR
    why = ("there is no ./memwatch here" if not d.exists() else
           "./memwatch holds no memwatch output (no bundle, no oom/ or blackbox/ folder, no "
           "summary.json)")
    raise BundleError(f"{why}; name the out_dir your run wrote to: memwatch {command} DIR")


def non_negative_int(text: str) -> int:
    """An argparse ``type``: an integer of 0 or more (``--rows -3`` is refused)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v
