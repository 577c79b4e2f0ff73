"""Housekeeping of a run's bundle folder: temporary directories of dead writers, retention.

Example::

    >>> from memwatch.bundle import clean_stale, enforce_retention
    >>> clean_stale(os.path.join(tmp, "nothing-here")), enforce_retention(tmp, 20, 2**30)
    ([], [])
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from memwatch.bundle.format import TMP_PREFIX, dir_size, host_name

__all__ = ["STALE_AFTER_S", "clean_stale", "enforce_retention"]

#: Temporary directories older than this are removed even when their writer's pid is unknown
#: (another host on a shared filesystem).
STALE_AFTER_S = 3600.0


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


def clean_stale(oom_root: str | os.PathLike[str]) -> list[Path]:
    """Remove temporary bundle directories left by writers that died (returns what it removed).

    A temporary directory of this host is stale when its writer's pid is gone; one of another host
    (shared filesystem) when it is older than :data:`STALE_AFTER_S`.
    """
    root = Path(oom_root)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    me = host_name()
    now = time.time()
    for entry in os.scandir(root):
        if not (entry.name.startswith(TMP_PREFIX) and entry.is_dir(follow_symlinks=False)):
            continue
        parts = entry.name[len(TMP_PREFIX):].rsplit("-", 2)
        stale = False
        if len(parts) == 3 and parts[0] == me and parts[1].isdigit():
            pid = int(parts[1])
            stale = pid != os.getpid() and not _pid_alive(pid)
        try:
            if not stale and now - entry.stat().st_mtime > STALE_AFTER_S:
                stale = True
        except OSError:
            continue
        if stale:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def enforce_retention(
    oom_root: str | os.PathLike[str], max_bundles: int, max_total_bytes: int,
    keep: Path | None = None,
) -> list[Path]:
    """Delete the oldest finished bundles beyond ``max_bundles`` or ``max_total_bytes``.

    ``keep`` (the bundle just written) is never deleted. Returns the deleted paths.
    """
    root = Path(oom_root)
    if not root.is_dir():
        return []
    found: list[tuple[int, Path, int]] = []
    for entry in os.scandir(root):
        if entry.name.startswith(TMP_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        m = Path(entry.path) / "manifest.json"
        try:
            mtime = m.stat().st_mtime_ns
        except OSError:
            continue  # not a bundle: leave it alone
        found.append((mtime, Path(entry.path), dir_size(Path(entry.path))))
    found.sort()
    total = sum(s for _, _, s in found)
    count = len(found)
    deleted: list[Path] = []
    for _, path, size in found:
        if count <= max_bundles and total <= max_total_bytes:
            break
        if keep is not None and path.resolve() == keep.resolve():
            continue
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
        count -= 1
        total -= size
    return deleted
