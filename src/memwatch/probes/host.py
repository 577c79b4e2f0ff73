"""Host memory of this process: RSS per step; USS/PSS and RSS by kind in the background.

RSS per step comes from one ``pread`` on a kept-open ``/proc/self/statm`` (about 2 us). USS and
PSS need ``/proc/self/smaps_rollup`` (cost grows with RSS: ~20 ms per GiB), so they are read on the
background thread. So is RSS by kind (anonymous, file-backed, shared memory) from
``/proc/self/status`` (about 10 us). ``statm`` has a ``shared`` field that would cost ~0.3 us more
per step, but it adds shared memory to file-backed pages, and shared memory (batches a DataLoader
worker passed through ``/dev/shm``) is not reclaimable: a run keeping those batches would look like
a mapped file. Off Linux, psutil provides RSS and the split is absent. The C allocator's in-use
and free bytes (glibc ``mallinfo2``, :mod:`memwatch.probes.malloc`) are read in the background
too, where they exist.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from memwatch.core.forking import ForkRegistry
from memwatch.probes import procfs
from memwatch.probes.malloc import KEYS as MALLOC_KEYS
from memwatch.probes.malloc import MallocInfo

log = logging.getLogger("memwatch")

# /proc/self resolves when opened: a forked child (a DataLoader worker) would otherwise keep
# reading its parent's statm through the inherited descriptor.
_in_children = ForkRegistry("after_fork_in_child")


class HostProbe:
    """Host memory of the current process.

    Example::

        >>> from memwatch.probes.host import HostProbe
        >>> p = HostProbe()
        >>> rss, = p.read_fast()
        >>> rss > 0
        True
        >>> p.close()
    """

    name = "host"
    fast_keys: tuple[str, ...] = ("host.rss",)
    slow_keys: tuple[str, ...] = ("host.uss", "host.pss", "host.swap", "host.rss_anon",
                                  "host.rss_file", "host.rss_shmem")

    def __init__(self) -> None:
        self._fd = -1
        self._pid = -1
        self._psutil_proc: Any = None  # psutil.Process off Linux
        self._open()
        # The C allocator's in-use and free bytes, where glibc has mallinfo2 (probes/malloc.py).
        self._malloc = MallocInfo.open()
        if self._malloc is not None:
            self.slow_keys = (*HostProbe.slow_keys, *MALLOC_KEYS)
        _in_children.add(self)

    def malloc_now(self) -> dict[str, float] | None:
        """The C allocator's in-use and free bytes now (``host.malloc_in_use``,
        ``host.malloc_free``; None without ``mallinfo2``): 0.1 ms on a small heap, several
        ms on a fragmented one (6 ms measured: it walks the free lists), so never per step."""
        if self._malloc is None:
            return None
        return self._malloc.read()

    def _open(self) -> None:
        self._pid = os.getpid()
        if sys.platform.startswith("linux"):
            try:
                self._fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
                return
            except OSError:
                self._fd = -1
        import psutil

        self._psutil_proc = psutil.Process()

    def after_fork_in_child(self) -> None:
        """In a forked child: read the child's own statm from now on."""
        if self._fd >= 0 or self._psutil_proc is not None:
            self._close_fd()
            self._open()

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def read_fast(self) -> Sequence[float]:
        if self._fd >= 0:
            return (float(procfs.rss_from_statm_fd(self._fd)),)
        proc = self._psutil_proc
        return (float(proc.memory_info().rss),)

    def read_slow(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if sys.platform.startswith("linux"):
            pid = os.getpid()
            r = procfs.read_smaps_rollup(pid)
            if r is not None:
                out.update({"host.uss": r.uss, "host.pss": r.pss, "host.swap": r.swap})
            split = procfs.read_rss_split(pid)
            if r is not None:
                split = procfs.exact_rss_split(r, split)
            if split is not None:
                out.update({"host.rss_anon": split.anon, "host.rss_file": split.file,
                            "host.rss_shmem": split.shmem})
        if self._malloc is not None:
            out.update(self._malloc.read())
        return out

    def limits(self) -> dict[str, float]:
        lim = procfs.host_memory_limit()
        if lim is None:
            return {}
        # Not host.rss_file: its pages are reclaimable page cache, not what runs into the limit.
        return {k: float(lim) for k in ("host.rss", "host.uss", "host.pss", "host.rss_anon",
                                        "host.rss_shmem")}

    def close(self) -> None:
        self._psutil_proc = None
        self._close_fd()
