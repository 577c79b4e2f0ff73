"""Housekeeping of a run's bundle folder: temporary files of dead writers, retention per run.

An ``out_dir`` can be shared: several runs of one user (or of a team, with ``share="group"``)
write into the same ``oom/``. Retention is therefore **per run**: every bundle's manifest names
the run that wrote it (``run_id``, drawn at the recorder's start), and a run deletes only its own
old bundles beyond ``max_bundles`` / ``max_total_bytes``, never another run's and never one that
is still being written (a temporary ``.tmp-*`` directory, or a bundle with a ``.part`` file in
it). Bundles of earlier runs stay until you delete them (``memwatch ls`` lists them).

Example::

    >>> from memwatch.bundle import clean_stale, enforce_retention
    >>> clean_stale(os.path.join(tmp, "nothing-here")), enforce_retention(tmp, 20, 2**30, "r1")
    ([], [])
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

from memwatch.bundle.format import TMP_PREFIX, dir_size, host_name
from memwatch.core.safefs import read_bounded

__all__ = ["STALE_AFTER_S", "bundle_run_id", "clean_stale", "enforce_retention"]

#: Temporary directories older than this are removed even when their writer's pid is unknown
#: (another host on a shared filesystem).
STALE_AFTER_S = 3600.0
_MANIFEST_CAP = 1 << 20
_BUNDLE_NAME = re.compile(r"[^-]+-(?P<host>.+)-rank\d+-pid(?P<pid>\d+)(?:-\d+)?")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _writer_dead(name: str, me: str) -> bool:
    """Whether the process named in a bundle's name (``<time>-<host>-rank<r>-pid<p>``) ran on
    this host and is gone."""
    m = _BUNDLE_NAME.fullmatch(name)
    if m is None or m.group("host") != me:
        return False
    pid = int(m.group("pid"))
    return pid != os.getpid() and not _pid_alive(pid)


def clean_stale(oom_root: str | os.PathLike[str]) -> list[Path]:
    """Remove what writers that died left behind (returns what it removed): temporary bundle
    directories, and ``.part`` files inside finished bundles (a report being added when the
    process was killed). Only this user's entries are touched.

    A temporary directory of this host is stale when its writer's pid is gone; one of another host
    (shared filesystem) when it is older than :data:`STALE_AFTER_S`.
    """
    root = Path(oom_root)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    me = host_name()
    uid = os.geteuid()
    now = time.time()
    for entry in os.scandir(root):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        if entry.name.startswith(TMP_PREFIX):
            parts = entry.name[len(TMP_PREFIX):].rsplit("-", 2)
            stale = False
            if len(parts) == 3 and parts[0] == me and parts[1].isdigit():
                pid = int(parts[1])
                stale = pid != os.getpid() and not _pid_alive(pid)
            if not stale and now - st.st_mtime > STALE_AFTER_S:
                stale = True
            if stale:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
            continue
        if not _writer_dead(entry.name, me):
            continue
        with contextlib.suppress(OSError):
            for f in os.scandir(entry.path):
                if f.name.endswith(".part") and f.is_file(follow_symlinks=False):
                    os.unlink(f.path)
                    removed.append(Path(f.path))
    return removed


def bundle_run_id(path: str | os.PathLike[str]) -> str | None:
    """The ``run_id`` a finished bundle's manifest names (None: unreadable, or written by a
    memwatch before manifests named their run)."""
    try:
        doc = json.loads(read_bounded(Path(path) / "manifest.json", _MANIFEST_CAP))
    except (OSError, ValueError, RecursionError):
        return None
    rid = doc.get("run_id") if isinstance(doc, dict) else None
    return rid if isinstance(rid, str) else None


def _writing(path: Path) -> bool:
    """A bundle is being added to (a ``.part`` file in it) or cannot be listed."""
    try:
        return any(n.endswith(".part") for n in os.listdir(path))
    except OSError:
        return True


def enforce_retention(
    oom_root: str | os.PathLike[str], max_bundles: int, max_total_bytes: int,
    run_id: str, keep: Path | None = None,
) -> list[Path]:
    """Delete the oldest finished bundles of run ``run_id`` beyond ``max_bundles`` or
    ``max_total_bytes`` (counted over that run's bundles only).

    Bundles of other runs, bundles being written (a ``.part`` inside) and ``keep`` (the bundle
    just written) are never deleted. Returns the deleted paths.
    """
    root = Path(oom_root)
    if not root.is_dir():
        return []
    uid = os.geteuid()
    found: list[tuple[int, Path, int]] = []
    for entry in os.scandir(root):
        if entry.name.startswith(TMP_PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        p = Path(entry.path)
        if bundle_run_id(p) != run_id:
            continue  # another run's, or not a bundle: leave it alone
        try:
            mtime = os.stat(p / "manifest.json", follow_symlinks=False).st_mtime_ns
        except OSError:
            continue
        found.append((mtime, p, dir_size(p)))
    found.sort()
    total = sum(s for _, _, s in found)
    count = len(found)
    deleted: list[Path] = []
    for _, path, size in found:
        if count <= max_bundles and total <= max_total_bytes:
            break
        if keep is not None and path.name == keep.name:
            continue
        if _writing(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
        count -= 1
        total -= size
    return deleted
