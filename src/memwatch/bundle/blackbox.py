"""The black box on disk: what a watched run keeps of itself in case it dies without a word.

The kernel's OOM killer and ``kill -9`` send SIGKILL: no exception, no ``atexit``, no bundle.
While a run is watched, :class:`memwatch.runtime.blackbox.BlackBox` rewrites one small JSON
file every few seconds (atomically: a temporary file renamed over the old one), and removes it
when the run closes cleanly. A record left behind by a process that no longer exists is the
evidence of an unclean end. This module reads such records and judges them:

* ``<out_dir>/blackbox/<host>-pid<pid>.json``: the record of a run (live, or dead unnoticed);
* ``<out_dir>/blackbox/ended/<UTC time>-<host>-pid<pid>.json``: a dead run's record once a later
  run in the same ``out_dir`` reported it (with its ``end`` judgement added), so it is reported
  once and ``memwatch ls`` still lists it.

A record is read as untrusted (another user, or a fault, may have written it): at most
:data:`MAX_RECORD_BYTES`, a regular file never read through a symlink, JSON with a depth cap and
typed fields, strings made printable. The cgroup path it names is opened only when it is a
plain path under ``/sys/fs/cgroup`` (no symlink, no ``..``) and its events file a regular file:
a record pointing at ``/dev/zero`` or a FIFO is not read from.

A record says the run was **killed by the kernel's OOM killer** when its memory cgroup's
OOM-kill counter is above the value the last rewrite saw (read again from the cgroup, which
still exists while the job's container does), or when the kernel log (``/dev/kmsg``, readable
by root) names the process as killed; otherwise "ended without a clean close" (SIGKILL from
someone else, a segfault, power loss).

Example::

    >>> import os, json
    >>> from memwatch.bundle.blackbox import judge, record_path
    >>> doc = {"pid": 2 ** 22 + 7, "host": "elsewhere", "step": 812, "latest": {},
    ...        "cgroup": None}
    >>> judge(doc)["state"]  # a record from another host cannot be checked from here
    'unknown'
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import socket
import stat
import time
from pathlib import Path
from typing import Any

from memwatch.bundle.schema import FINDING, DictOf, ListOf, Obj, T
from memwatch.core.safefs import ensure_dir, open_dir, read_bounded, write_atomic
from memwatch.core.units import fmt_bytes
from memwatch.core.untrusted import loads_json, sanitize
from memwatch.probes.procfs import process_start

__all__ = ["BLACKBOX_SUBDIR", "CGROUP_ROOT", "ENDED_SUBDIR", "MAX_RECORD_BYTES", "SCHEMA",
           "boot_id", "clean_parts", "find_records", "judge", "process_start", "read_record",
           "record_path", "retire", "summary_line"]

BLACKBOX_SUBDIR = "blackbox"
ENDED_SUBDIR = "ended"
SCHEMA = 1
_KIND = "memwatch-blackbox"
#: Largest record read (one memwatch writes is a few hundred KiB at most).
MAX_RECORD_BYTES = 4 << 20
#: The only place a record's cgroup path may point to.
CGROUP_ROOT = "/sys/fs/cgroup"
# The OOM-kill counter's file of each cgroup version (v2 memory.events, v1 memory.oom_control).
_EVENTS = {2: "memory.events", 1: "memory.oom_control"}
_OOM_KILL = re.compile(rb"(?m)^oom_kill (\d{1,18})$")
_N = T(float, type(None))
_RECORD = Obj({
    "pid": T(int, lo=1, hi=1 << 31), "host": T(str, type(None)), "step": T(int, type(None)),
    "epoch": T(int, type(None)), "latest": DictOf(_N, none=True),
    "limits": DictOf(_N, none=True), "started_unix": _N, "updated_unix": _N,
    "proc_start": T(int, type(None)), "boot_id": T(str, type(None)),
    "cgroup": Obj({"path": T(str, type(None)), "version": T(int, type(None)),
                   "oom_kills": T(int, type(None)), "oom_kills_at_start": T(int, type(None))},
                  none=True),
    "findings": ListOf(FINDING, none=True),
    "samples": ListOf(Obj({"t": _N, "step": T(int, type(None)),
                           "values": DictOf(_N, none=True)}), none=True),
    "end": T(dict, type(None)),
})


def record_path(out_dir: str | os.PathLike[str], pid: int | None = None) -> Path:
    """Where the record of process ``pid`` (default: this one) on this host lives."""
    return Path(out_dir) / BLACKBOX_SUBDIR / f"{socket.gethostname()}-pid{pid or os.getpid()}.json"


def boot_id() -> str | None:
    """This boot of the kernel (a pid is only meaningful within one)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def read_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A record's document (validated, strings made printable); ``ValueError`` naming the file
    when it is not one."""
    p = Path(path)
    try:
        data = read_bounded(p, MAX_RECORD_BYTES)
    except OSError as e:
        raise ValueError(f"{p}: not a readable memwatch black-box record ({e})") from None
    doc = loads_json(data, str(p))
    if not isinstance(doc, dict) or doc.get("kind") != _KIND:
        raise ValueError(f"{p}: not a memwatch black-box record (no kind {_KIND!r})")
    err = _RECORD.error(doc)
    if err:
        raise ValueError(f"{p}: not a memwatch black-box record ({err})")
    return sanitize(doc)  # type: ignore[no-any-return]


def find_records(out_dir: str | os.PathLike[str],
                 ended: bool = True) -> list[tuple[Path, dict[str, Any]]]:
    """Every readable record under ``out_dir`` (live, and ended ones unless ``ended=False``),
    oldest first. Symlinks, FIFOs and unreadable or malformed files are left out."""
    base = Path(out_dir) / BLACKBOX_SUBDIR
    out = []
    for d in (base, base / ENDED_SUBDIR) if ended else (base,):
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                out.append((Path(entry.path), read_record(entry.path)))
            except (OSError, ValueError):
                continue  # a record being replaced right now, or not ours
    out.sort(key=lambda e: float(e[1].get("started_unix") or 0.0))
    return out


def clean_parts(out_dir: str | os.PathLike[str], older_than_s: float = 60.0) -> int:
    """Remove temporary ``.part`` files of rewrites a kill interrupted (this user's, older than
    ``older_than_s``); returns how many."""
    base = Path(out_dir) / BLACKBOX_SUBDIR
    n = 0
    now = time.time()
    for d in (base, base / ENDED_SUBDIR):
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
                if (e.name.endswith(".part") and stat.S_ISREG(st.st_mode)
                        and st.st_uid == os.geteuid() and now - st.st_mtime > older_than_s):
                    os.unlink(e.path)
                    n += 1
            except OSError:
                continue
    return n


def _alive(doc: dict[str, Any]) -> bool | None:
    """Whether the record's process still runs: None when that cannot be told from here."""
    if doc.get("host") != socket.gethostname():
        return None
    if doc.get("boot_id") and boot_id() and doc["boot_id"] != boot_id():
        return False  # the machine rebooted since
    pid = doc.get("pid")
    if not isinstance(pid, int):
        return None
    start = process_start(pid)
    if start is None:
        return False
    return doc.get("proc_start") in (None, start)


def _cgroup_events(path: Any, version: Any) -> str | None:
    """The events file of a record's cgroup, when the record names a real cgroup directory:
    a normalised path under :data:`CGROUP_ROOT` with no symlink on the way."""
    if not isinstance(path, str) or version not in _EVENTS or "\0" in path:
        return None
    norm = os.path.normpath(path)
    under = norm == CGROUP_ROOT or norm.startswith(CGROUP_ROOT + "/")
    if norm != path.rstrip("/") or not under:
        return None
    if os.path.realpath(norm) != norm:
        return None
    return os.path.join(norm, _EVENTS[version])


def _counter_now(cg: dict[str, Any]) -> int | None:
    """The OOM-kill counter of the record's cgroup, read again now (None: gone, unreadable, or
    a path this reader does not open)."""
    events = _cgroup_events(cg.get("path"), cg.get("version"))
    if events is None:
        return None
    try:
        raw = read_bounded(events, 64 * 1024)  # a regular file only: never a FIFO or device
    except OSError:
        return None
    m = _OOM_KILL.search(raw)
    return int(m.group(1)) if m else None


def _kernel_log_names(pid: int) -> bool:
    """Whether the kernel log says it OOM-killed ``pid`` (root only; never blocks)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    needle = f"Killed process {pid} (".encode()
    try:
        for _ in range(100_000):  # the ring holds a bounded number of records
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                return False
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not rec:
                return False
            if needle in rec and b"oom" in rec.lower():
                return True
        return False
    finally:
        os.close(fd)


def judge(doc: dict[str, Any]) -> dict[str, Any]:
    """How the record's run ended: ``state`` ``running``, ``unclean`` or ``unknown`` (another
    host), and for an unclean end whether the kernel's OOM killer did it, and why that is said.
    A record already judged (an ended one) keeps its judgement."""
    if isinstance(doc.get("end"), dict):
        return dict(doc["end"])
    alive = _alive(doc)
    if alive is None:
        return {"state": "unknown", "oom_killed": None,
                "why": f"recorded on host {doc.get('host')!r}: run `memwatch ls` there"}
    if alive:
        return {"state": "running", "oom_killed": None, "why": "the process is alive"}
    cg = doc.get("cgroup") or {}
    last = cg.get("oom_kills")
    now = _counter_now(cg) if cg else None
    if isinstance(last, int) and now is not None and now > last:
        return {"state": "unclean", "oom_killed": True, "oom_kills_seen": last,
                "oom_kills_now": now,
                "why": f"the cgroup's OOM-kill counter rose from {last} to {now} after the last "
                       "record"}
    if isinstance(doc.get("pid"), int) and _kernel_log_names(doc["pid"]):
        return {"state": "unclean", "oom_killed": True,
                "why": "the kernel log names the process as OOM-killed"}
    why = ("the cgroup's OOM-kill counter did not rise" if now is not None
           else "no OOM-kill evidence could be read (the cgroup is gone or there was none)")
    return {"state": "unclean", "oom_killed": False, "oom_kills_now": now, "why": why}


def summary_line(doc: dict[str, Any], end: dict[str, Any] | None = None) -> str:
    """One line for ``memwatch ls``: the end, the step, the cgroup's fill and the verdict."""
    end = end or judge(doc)
    latest = doc.get("latest") or {}
    parts = [f"pid {doc.get('pid')} on {doc.get('host')}", f"step {doc.get('step')}"]
    ws, lim = latest.get("cgroup.working_set"), latest.get("cgroup.limit")
    if isinstance(ws, (int, float)) and isinstance(lim, (int, float)) and lim > 0:
        parts.append(f"cgroup at {ws / lim:.0%} of {fmt_bytes(lim)}")
    cg = doc.get("cgroup") or {}
    if cg.get("oom_kills") is not None:
        seen = cg.get("oom_kills_at_start")
        now = end.get("oom_kills_now")
        parts.append(f"oom_kill counter {seen} at start, " + (
            f"{now} now" if now is not None else f"{cg.get('oom_kills')} at the last record"))
    state = end.get("state")
    if state == "running":
        verdict = "running"
    elif state == "unknown":
        verdict = "state unknown (" + str(end.get("why")) + ")"
    elif end.get("oom_killed"):
        verdict = "killed by the kernel's OOM killer"
    else:
        verdict = "ended without a clean close"
    return f"{verdict} at step {doc.get('step')}: " + ", ".join(parts[0:1] + parts[2:])


def retire(path: Path, doc: dict[str, Any], end: dict[str, Any],
           share: str = "private") -> Path:
    """Move a dead run's record to ``ended/`` with its judgement: it is reported once.

    Written relative to the directories' descriptors (``blackbox/`` opened without following a
    symlink, ``ended/`` made or checked as this user's), under a fresh temporary name: nothing
    planted there is written through."""
    doc = {**doc, "end": end}
    try:
        t = float(doc.get("updated_unix") or 0.0)
        when = _dt.datetime.fromtimestamp(t, _dt.timezone.utc)
    except (OverflowError, ValueError, OSError):
        when = _dt.datetime.fromtimestamp(0, _dt.timezone.utc)
    dfd = open_dir(path.parent)
    try:
        efd = ensure_dir(dfd, ENDED_SUBDIR, share)
        try:
            name = f"{when:%Y%m%dT%H%M%SZ}-{path.name}"
            write_atomic(efd, name, json.dumps(doc, indent=1).encode(), share=share)
        finally:
            os.close(efd)
        with contextlib.suppress(OSError):
            os.unlink(path.name, dir_fd=dfd)
    finally:
        os.close(dfd)
    return path.parent / ENDED_SUBDIR / name
