"""Which folders hold memwatch output, and the default ``out_dir`` the commands may take.

``./memwatch`` is memwatch's default ``out_dir``, but a folder of that name is just as often
something else (a clone of this repository): it is taken as the default only when it holds what a
run writes there — a bundle (its ``manifest.json``, or a writer's ``.tmp-`` folder), the ``oom/``
or ``end_of_run/`` folder, a black box (``blackbox/``), a finished run's ``summary.json``, or
per-rank ``out_dir``s holding those.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memwatch.bundle import OOM_SUBDIR, TMP_PREFIX, Bundle, find_bundles
from memwatch.bundle.blackbox import BLACKBOX_SUBDIR
from memwatch.bundle.format import END_OF_RUN_SUBDIR
from memwatch.bundle.run_summary import SUMMARY_FILE
from memwatch.core.errors import BundleError
from memwatch.report.jobs import group_jobs

__all__ = ["DEFAULT_OUT_DIR", "bundle_entries", "default_out_dir", "holds_output",
           "is_output_dir", "non_negative_int", "pick_bundle"]

#: ``MemWatch(out_dir=...)``'s default, relative to the working directory.
DEFAULT_OUT_DIR = "memwatch"


def _is_bundle(d: Path) -> bool:
    return d.name.startswith(TMP_PREFIX) or (d / "manifest.json").is_file()


def _is_out_dir(d: Path) -> bool:
    return (d / OOM_SUBDIR).is_dir() or (d / BLACKBOX_SUBDIR).is_dir() or \
        (d / END_OF_RUN_SUBDIR).is_dir() or (d / SUMMARY_FILE).is_file()


def holds_output(d: Path) -> bool:
    """Whether ``d`` is (or holds) memwatch output: a bundle, an ``out_dir`` (``oom/``,
    ``blackbox/``, a finished run's ``summary.json``), an ``oom/`` folder of bundles, or a folder
    of per-rank ``out_dir``s."""
    try:
        if not d.is_dir():
            return False
        if _is_bundle(d) or _is_out_dir(d):
            return True
        return any(c.is_dir() and (_is_bundle(c) or _is_out_dir(c)) for c in d.iterdir())
    except OSError:
        return False


def bundle_entries(d: Path) -> list[tuple[Path, Bundle | BundleError]]:
    """``find_bundles(d)`` without what an ``out_dir`` holds beside its bundles: its
    ``blackbox/`` folder, or a rank's ``out_dir`` with a black box and no ``oom/`` yet, are not
    broken bundles."""
    return [(p, b) for p, b in find_bundles(d) if isinstance(b, Bundle)
            or not (p.name == BLACKBOX_SUBDIR or _is_out_dir(p))]


def is_output_dir(d: Path) -> bool:
    """A folder of bundles (an ``out_dir``, its ``oom/``, per-rank ``out_dir``s), not a bundle."""
    return d.is_dir() and not _is_bundle(d) and holds_output(d)


def pick_bundle(d: Path) -> tuple[Path, str]:
    """The bundle a command shows for the folder ``d``, and one line saying which and why: the
    first failure of the newest distributed job when there is one, else the newest bundle."""
    entries = bundle_entries(d)
    good = [path for path, b in entries if not isinstance(b, BundleError)]
    if not good:
        raise BundleError(f"{d}: no readable bundle here (`memwatch ls {d}` says why)")
    jobs, _ = group_jobs(entries)
    if jobs:
        first = jobs[-1].first_failure()
        return first.path, (f"memwatch: {len(good)} bundle(s) under {d}; shown: job "
                            f"{jobs[-1].label}, rank {first.rank} ({first.trigger}), {first.path}")
    return good[-1], (f"memwatch: {len(good)} bundle(s) under {d}; shown: the newest, {good[-1]} "
                      f"(`memwatch ls {d}` lists them)")


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
