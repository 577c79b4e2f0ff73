"""One job's output, read from wherever its ranks and nodes wrote it.

Each rank writes where its ``out_dir`` points: one folder shared by the ranks of a host, one per
rank, or, across nodes, one (or one per rank) on each node's local disk. ``memwatch ls``,
``inspect`` and ``report`` take all of those folders at once, or one folder the user copied them
into (``rsync -a node1:/scratch/run/ gathered/node1/`` for each node). :func:`gather` finds the
output under each path it is given (an ``out_dir``, its ``oom/`` folder, one bundle, or a folder
holding any of those up to :data:`MAX_DEPTH` levels down, such as ``gathered/node1/rank3/``) and
lists every bundle once, oldest first: a bundle copied twice (gathered from a shared file system
*and* from the node) is one, known by its run id and name.

:attr:`Gathered.out_dirs` are the ``out_dir``s found (folders with ``oom/``, ``end_of_run/``,
``blackbox/`` or a finished run's ``summary.json``): a reader of what an ``out_dir`` holds
besides bundles (black-box records, what a finished run left:
:func:`memwatch.report.runs.find_runs`) takes them from there, so every command reads a job the
same way however it was spread.

Example::

    >>> from pathlib import Path
    >>> for node in ("node0", "node1"):
    ...     (Path(tmp) / node / "oom").mkdir(parents=True)
    >>> g = gather([Path(tmp)])
    >>> [p.name for p in g.out_dirs], g.entries
    (['node0', 'node1'], [])
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from memwatch.bundle import OOM_SUBDIR, TMP_PREFIX, Bundle, find_bundles
from memwatch.bundle.blackbox import BLACKBOX_SUBDIR
from memwatch.bundle.format import BUNDLE_SUBDIRS, END_OF_RUN_SUBDIR
from memwatch.bundle.run_summary import SUMMARY_FILE
from memwatch.core.errors import BundleError

__all__ = ["MAX_DEPTH", "MAX_FOLDERS", "Gathered", "gather", "holds_output", "is_bundle",
           "is_out_dir"]

#: How far below a given folder ``out_dir``s are looked for (``gathered/node1/rank3``: 2).
MAX_DEPTH = 3
#: Folders looked at under one given path, at most: a home directory named by mistake is not
#: walked whole.
MAX_FOLDERS = 5000


def _is_dir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)  # a symlink is never followed
    except OSError:
        return False


def is_bundle(d: Path) -> bool:
    """A bundle directory (its ``manifest.json``), or a writer's unfinished ``.tmp-`` one."""
    try:
        return d.name.startswith(TMP_PREFIX) or stat.S_ISREG(os.lstat(d / "manifest.json").st_mode)
    except OSError:
        return False


def is_out_dir(d: Path) -> bool:
    """An ``out_dir``: it holds memwatch's ``oom/``, ``end_of_run/`` or ``blackbox/`` folder, or
    what a finished run left (its ``summary.json``)."""
    if _is_dir(d / OOM_SUBDIR) or _is_dir(d / END_OF_RUN_SUBDIR) or _is_dir(d / BLACKBOX_SUBDIR):
        return True
    try:
        return stat.S_ISREG(os.lstat(d / SUMMARY_FILE).st_mode)
    except OSError:
        return False


def _subdirs(d: Path) -> list[Path]:
    try:
        with os.scandir(d) as it:
            return sorted(Path(e.path) for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


@dataclasses.dataclass
class Gathered:
    """What :func:`gather` found: the ``out_dir``s, and every bundle once, oldest first (each
    the opened bundle or why it cannot be opened)."""

    out_dirs: list[Path]
    entries: list[tuple[Path, Bundle | BundleError]]


def _sources(root: Path) -> tuple[list[Path], list[Path]]:
    """(out_dirs, folders of bundles or single bundles) under ``root``."""
    out_dirs: list[Path] = []
    bundle_roots: list[Path] = []
    frontier, seen = [(root, 0)], 0
    while frontier and seen < MAX_FOLDERS:
        d, depth = frontier.pop(0)
        seen += 1
        if is_bundle(d):
            bundle_roots.append(d)
        elif is_out_dir(d):
            out_dirs.append(d)
        elif d.name in BUNDLE_SUBDIRS or any(is_bundle(c) for c in _subdirs(d)):
            bundle_roots.append(d)  # an oom/ folder, or bundles copied into one folder
            if d.name in BUNDLE_SUBDIRS and d.parent not in out_dirs:
                out_dirs.append(d.parent)
        elif depth < MAX_DEPTH:
            frontier.extend((c, depth + 1) for c in _subdirs(d))
    return out_dirs, bundle_roots


def holds_output(d: Path) -> bool:
    """Whether ``d`` is, or holds within :data:`MAX_DEPTH` levels, memwatch output: a bundle, an
    ``out_dir`` (``oom/``, ``blackbox/``), or an ``oom/`` folder or other folder of bundles."""
    if not _is_dir(d):
        return False
    out_dirs, roots = _sources(d)
    return bool(out_dirs or roots)


def _key(path: Path, b: Bundle | BundleError) -> tuple[str, str]:
    run = b.manifest.get("run_id") if isinstance(b, Bundle) else None
    return (str(run), path.name) if isinstance(run, str) and run else ("", str(path.resolve()))


def gather(paths: Iterable[str | os.PathLike[str]]) -> Gathered:
    """Every ``out_dir`` and bundle under ``paths`` (see the module doc).

    Raises :class:`BundleError` naming a path that does not exist or is not a folder.
    """
    out_dirs: list[Path] = []
    roots: list[Path] = []
    for p in map(Path, paths):
        if not _is_dir(p):
            raise BundleError(f"{p}: no such directory" if not p.exists() else
                              f"{p}: not a directory (name an out_dir, its oom/ folder or a "
                              "bundle)")
        o, r = _sources(p)
        out_dirs += [d for d in o if d not in out_dirs]
        roots += r
    found: dict[tuple[str, str], tuple[Path, Bundle | BundleError]] = {}
    for d in [*out_dirs, *roots]:
        for path, b in find_bundles(d):
            if isinstance(b, BundleError) and (path.name == BLACKBOX_SUBDIR or is_out_dir(path)):
                continue  # what an out_dir holds beside its bundles is not a broken bundle
            found.setdefault(_key(path, b), (path, b))
    entries = sorted(found.values(),
                     key=lambda e: (e[0].name.startswith(TMP_PREFIX), e[0].name, str(e[0])))
    return Gathered(out_dirs=out_dirs, entries=entries)
