"""The memory cgroup this process is in: what the kernel's OOM killer counts, in the background.

When a cgroup's memory limit is hit and reclaim cannot free enough, the kernel kills a process
of that cgroup with SIGKILL: no exception, no traceback, often a DataLoader worker rather than
the training process. The figures that decide it are the cgroup's, not one process's RSS: every
process of the cgroup (the training process, its workers, page cache they caused) is charged to
it. This probe reads those figures on the background thread (never per step) from kept-open
descriptors (one ``pread`` per file), and the OOM-kill counter that says afterwards that a death
was the kernel's.

Keys (bytes unless said; v2 source / v1 source):

- ``cgroup.usage``: ``memory.current`` / ``memory.usage_in_bytes``. What the kernel charges to
  the cgroup (its subtree) and compares with the limit.
- ``cgroup.working_set``: usage less ``memory.stat`` ``inactive_file`` / ``total_inactive_file``:
  usage without the page cache reclaimed first (the kubelet's and cAdvisor's working set).
- ``cgroup.file``: ``memory.stat`` ``file`` / ``total_cache``. Page cache and shmem/tmpfs:
  mostly reclaimable (shmem is not, without swap).
- ``cgroup.anon``: ``memory.stat`` ``anon`` / ``total_rss``. Anonymous memory (heaps, tensors on
  the host): reclaimable only to swap.
- ``cgroup.limit``: the smallest ``memory.max`` / ``memory.limit_in_bytes`` of the cgroup and its
  visible ancestors (v1 also ``hierarchical_memory_limit``): the limit the OOM killer enforces.
  Absent when there is none.
- ``cgroup.oom_kills`` (count, cumulative): ``memory.events`` ``oom_kill`` (the subtree) /
  ``memory.oom_control`` ``oom_kill`` (this cgroup only on kernels >= 5.7, the subtree on
  5.2-5.6, absent before 4.13). Processes the kernel OOM-killed.
- ``cgroup.oom_kills_local`` (count, cumulative, v2 only): ``memory.events.local`` ``oom_kill``.
- ``system.available``: ``/proc/meminfo`` ``MemAvailable``: what the whole machine can still
  give without swapping.

When there is no memory cgroup to read (not Linux, the root cgroup with no limit, the memory
controller not enabled, files unreadable), :attr:`CgroupProbe.available` is False and
:attr:`CgroupProbe.reason` says why; ``system.available`` is still read when ``/proc/meminfo``
is. Reads never raise: a cgroup that disappears turns the probe unavailable.

Example::

    >>> from memwatch.probes.cgroup import CgroupProbe
    >>> p = CgroupProbe()
    >>> p.available or bool(p.reason)
    True
    >>> set(p.read_slow()) <= set(p.slow_keys)
    True
    >>> p.close()
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from memwatch.probes.cgroup_locate import (
    CgroupLocation,
    Unavailable,
    locate,
    parse_mountinfo,
    parse_proc_cgroup,
)

__all__ = ["BYTE_KEYS", "CgroupLocation", "CgroupProbe", "Unavailable", "locate",
           "parse_mountinfo", "parse_proc_cgroup", "read_oom_kills"]

#: cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages (0x7FFFFFFFFFFFF000 with 4 KiB pages);
#: anything this large is no limit.
_NO_LIMIT = 1 << 60
_BUF = 16384

BYTE_KEYS: tuple[str, ...] = ("cgroup.usage", "cgroup.working_set", "cgroup.file", "cgroup.anon")


def _parse_int(raw: bytes) -> int | None:
    raw = raw.strip()
    if raw in (b"", b"max"):
        return None
    v = int(raw)
    return v if 0 < v < _NO_LIMIT else None


def _field(raw: bytes, key: bytes) -> int | None:
    """The value of ``key value`` line ``key`` in ``raw`` (memory.stat, memory.events), or None.

    A find per key instead of splitting every line: memory.stat has 40-70 lines and only a few
    are wanted.
    """
    if raw.startswith(key + b" "):
        i = len(key) + 1
    else:
        i = raw.find(b"\n" + key + b" ")
        if i < 0:
            return None
        i += len(key) + 2
    j = raw.find(b"\n", i)
    return int(raw[i:] if j < 0 else raw[i:j])


class _File:
    """A kept-open file read whole with ``pread`` at offset 0 (kernfs and procfs regenerate)."""

    __slots__ = ("fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> bytes:
        data = os.pread(self.fd, _BUF, 0)
        if len(data) < _BUF:
            return data
        chunks = [data]
        while len(data) == _BUF:
            data = os.pread(self.fd, _BUF, sum(map(len, chunks)))
            chunks.append(data)
        return b"".join(chunks)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


@dataclasses.dataclass(frozen=True)
class _Layout:
    """File names and ``memory.stat`` keys of one cgroup version."""

    usage: str
    limit: str
    events: str  # holds the ``oom_kill`` line
    inactive_file: bytes
    file: bytes
    anon: bytes


# v2 memory.stat is recursive; v1 keeps local figures unprefixed and the subtree's as total_*.
_LAYOUT = {
    2: _Layout("memory.current", "memory.max", "memory.events", b"inactive_file", b"file", b"anon"),
    1: _Layout(
        "memory.usage_in_bytes",
        "memory.limit_in_bytes",
        "memory.oom_control",
        b"total_inactive_file",
        b"total_cache",
        b"total_rss",
    ),
}


class CgroupProbe:
    """Memory of this process's cgroup (v1 or v2) and the machine's available memory.

    ``location`` defaults to :func:`locate` for this process; pass a :class:`CgroupLocation` to
    watch another cgroup (tests, a parent job's cgroup) or an :class:`Unavailable`. ``meminfo``
    is the file ``system.available`` comes from.
    """

    name = "cgroup"
    fast_keys: tuple[str, ...] = ()

    def __init__(
        self,
        location: CgroupLocation | Unavailable | None = None,
        *,
        meminfo: str = "/proc/meminfo",
    ) -> None:
        self.location: CgroupLocation | None = None
        self.reason: str | None = None
        self._files: dict[str, _File] = {}
        self._limit_files: list[_File] = []
        self._limit: int | None = None
        self._meminfo: _File | None = None
        try:
            self._meminfo = _File(meminfo)
        except OSError:
            self._meminfo = None
        loc = locate() if location is None else location
        if isinstance(loc, Unavailable):
            self.reason = loc.reason
        else:
            self._open(loc)
        self.slow_keys: tuple[str, ...] = self._keys()

    # -- setup ------------------------------------------------------------------------------

    def _open(self, loc: CgroupLocation) -> None:
        names = _LAYOUT[loc.version]
        try:
            self._files["usage"] = _File(os.path.join(loc.path, names.usage))
            self._files["events"] = _File(os.path.join(loc.path, names.events))
            self._files["stat"] = _File(os.path.join(loc.path, "memory.stat"))
            if loc.version == 2:
                try:
                    self._files["events_local"] = _File(
                        os.path.join(loc.path, "memory.events.local")
                    )
                except OSError:
                    pass  # kernels before 5.2
            # The effective limit is the smallest on the way up: a child's own limit may be
            # "max" while its parent's is what the OOM killer enforces.
            d = loc.path
            while True:
                try:
                    self._limit_files.append(_File(os.path.join(d, names.limit)))
                except OSError:
                    pass  # the v2 root has no memory.max
                if os.path.normpath(d) == os.path.normpath(loc.mount) or d in ("/", ""):
                    break
                d = os.path.dirname(d.rstrip("/"))
        except OSError as e:
            self._close_cgroup()
            self.reason = f"cannot open {e.filename}: {e.strerror}"
            return
        self.location = loc
        try:
            self._limit = self._read_limit(self._files["stat"].read())
        except (OSError, ValueError) as e:
            self._close_cgroup()
            self.location = None
            self.reason = f"cannot read the limits of {loc.path}: {e}"
            return
        if loc.version == 1 and self._limit is None and loc.cgroup == "/" and loc.path == loc.mount:
            self._close_cgroup()
            self.location = None
            self.reason = f"{loc.path} is the root memory cgroup (v1) and no limit applies"

    def _keys(self) -> tuple[str, ...]:
        keys: list[str] = []
        if self.location is not None:
            keys += [*BYTE_KEYS, "cgroup.limit", "cgroup.oom_kills"]
            if "events_local" in self._files:
                keys.append("cgroup.oom_kills_local")
        if self._meminfo is not None:
            keys.append("system.available")
        return tuple(keys)

    @property
    def available(self) -> bool:
        """True while a memory cgroup is being read."""
        return self.location is not None

    @property
    def version(self) -> int | None:
        return self.location.version if self.location is not None else None

    # -- reads ------------------------------------------------------------------------------

    def _read_limit(self, stat: bytes | None) -> int | None:
        limits = []
        for f in self._limit_files:
            v = _parse_int(f.read())
            if v is not None:
                limits.append(v)
        if stat is not None and self.location is not None and self.location.version == 1:
            # v1 computes the effective limit itself, ancestors outside a container included.
            h = _field(stat, b"hierarchical_memory_limit")
            if h is not None and 0 < h < _NO_LIMIT:
                limits.append(h)
        return min(limits) if limits else None

    def _read_available(self, out: dict[str, float]) -> None:
        if self._meminfo is None:
            return
        try:
            raw = self._meminfo.read()
            i = raw.find(b"MemAvailable:")
            if i >= 0:
                kib = int(raw[i + 13 : raw.find(b"\n", i)].split()[0])
                out["system.available"] = float(kib * 1024)
        except (OSError, ValueError, IndexError):
            pass  # a kernel before 3.14 has no MemAvailable: the key is simply absent

    def read_slow(self) -> dict[str, float]:
        out: dict[str, float] = {}
        self._read_available(out)
        loc = self.location
        if loc is None:
            return out
        names = _LAYOUT[loc.version]
        local = self._files.get("events_local")
        try:
            usage = int(self._files["usage"].read())
            stat = self._files["stat"].read()
            kills = _field(self._files["events"].read(), b"oom_kill")
            local_kills = _field(local.read(), b"oom_kill") if local is not None else None
            self._limit = self._read_limit(stat)
            inactive_file = _field(stat, names.inactive_file) or 0
            file = _field(stat, names.file)
            anon = _field(stat, names.anon)
        except (OSError, ValueError) as e:
            # The cgroup was removed (ENODEV) or became unreadable: stop reading it.
            self.reason = f"cgroup {loc.path} became unreadable: {e}"
            self._close_cgroup()
            self.location = None
            return out
        out["cgroup.usage"] = float(usage)
        out["cgroup.working_set"] = float(max(0, usage - inactive_file))
        out["cgroup.file"] = _num(file)
        out["cgroup.anon"] = _num(anon)
        if self._limit is not None:
            out["cgroup.limit"] = float(self._limit)
        out["cgroup.oom_kills"] = _num(kills)
        if local is not None:
            out["cgroup.oom_kills_local"] = _num(local_kills)
        return out

    def read_fast(self) -> Sequence[float]:
        return ()

    def oom_kills(self) -> int | None:
        """The cumulative OOM-kill counter now (one read), or None when it cannot be read.

        Read it before and after a child or worker dies: a rise says the kernel killed it.
        """
        f = self._files.get("events")
        if f is None:
            return None
        try:
            return _field(f.read(), b"oom_kill")
        except (OSError, ValueError):
            return None

    def limits(self) -> dict[str, float]:
        if self._limit is None or self.location is None:
            return {}
        # The working set is what the OOM killer acts on (page cache is reclaimed first); usage
        # and the others are shown against the limit too.
        return {k: float(self._limit) for k in BYTE_KEYS}

    def describe(self) -> dict[str, object]:
        """Which cgroup is read, its version and limit, or why none is (for bundles)."""
        loc = self.location
        return {
            "available": loc is not None,
            "reason": self.reason,
            "version": loc.version if loc else None,
            "path": loc.path if loc else None,
            "cgroup": loc.cgroup if loc else None,
            "limit": self._limit,
        }

    def _close_cgroup(self) -> None:
        for f in (*self._files.values(), *self._limit_files):
            f.close()
        self._files = {}
        self._limit_files = []

    def close(self) -> None:
        self._close_cgroup()
        if self._meminfo is not None:
            self._meminfo.close()
            self._meminfo = None


def read_oom_kills(path: str, version: int) -> int | None:
    """The OOM-kill counter of the cgroup at ``path`` (v1 or v2), read once by path; None when
    it is gone or unreadable (a dead run's cgroup, judged afterwards from its black box)."""
    try:
        with open(os.path.join(path, _LAYOUT[version].events), "rb") as f:
            return _field(f.read(), b"oom_kill")
    except (OSError, ValueError, KeyError):
        return None


def _num(v: int | None) -> float:
    return math.nan if v is None else float(v)
