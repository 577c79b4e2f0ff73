"""Allocation sites of growing Python memory: tracemalloc snapshots diffed at epoch ends.

Opt-in (``MemWatch(tracemalloc=True)``, or a number of frames). A census of live tensors cannot
see a leak of plain Python objects (a list that gains a dict of floats every step, a string log,
a cache of bytes or numpy arrays): floats, strings, bytes and dicts of them are not even tracked
by the garbage collector. tracemalloc records where every Python allocation was made; a snapshot
at each epoch end, grouped by the innermost frame of *user* code (not the standard library,
installed packages or memwatch), diffed against the previous epoch end's, names the lines whose
allocations grew and are still alive.

Costs (``benchmarks/bench_tracemalloc_cost.py``, ``docs/benchmarks.md``): tracing slows every
Python allocation while it is on (1.6 us each with 8 frames) and keeps a trace per live block
(about 100 bytes of RSS each); the snapshot (about 100 bytes per live traced block, for a
moment), its grouping and the diff run at epoch ends only. Only the previous epoch's per-site
totals are kept, not the snapshot. Grouping is by traceback, then by site: the innermost user
frame cannot be found from the innermost frame alone, and grouping by line saves little (0.09
against 0.21 s per million traces) next to the snapshot itself (0.35 s).

Ownership: memwatch starts tracing only when nobody else traces. If the user (or ``python -X
tracemalloc``) already did, memwatch reads that tracing, with its frame limit, and never stops
it; when memwatch started it, the last session using it stops it at close. A forked child
(DataLoader worker) stops tracing that memwatch started: nothing reads it there.

Example::

    >>> from memwatch.analysis.culprits.census.allocations import AllocationTracer
    >>> import tracemalloc
    >>> tracer = AllocationTracer(frames=4).start()
    >>> kept = []
    >>> _ = tracer.epoch_end(epoch=1, step=10, rss=None)
    >>> kept.extend(bytes(1000 + i) for i in range(100))
    >>> diff = tracer.epoch_end(epoch=2, step=20, rss=None)
    >>> top = diff.growths[0]
    >>> top.count_delta >= 100 and top.bytes_delta >= 100_000
    True
    >>> tracer.close()
    >>> tracemalloc.is_tracing() == tracer.was_tracing
    True
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time
import tracemalloc
from typing import Any

from memwatch.analysis.culprits.census.sites import (
    TOP_SITES,
    TRACE_RSS_FACTOR,
    AllocationDiff,
    Frames,
    SiteGrowth,
    excluded,
    group_traces,
    is_user_file,
    short_path,
)

#: Frames kept per allocation with ``tracemalloc=True``: enough to reach user code from inside
#: most library calls (``json.loads`` is 3 deep, ``copy.deepcopy`` 2 per level of nesting). Each
#: frame costs time on every allocation: 1.6 us per allocation with 8 frames, 2.6 us with 16,
#: 0.64 us with 1, against 0.04 us untraced (CPython 3.11, allocations 20 frames deep;
#: ``benchmarks/bench_tracemalloc_cost.py``).
DEFAULT_FRAMES = 8
#: More frames cost more per allocation and name nothing more.
MAX_FRAMES = 256


# --------------------------------------------------------------------------- ownership
_lock = threading.Lock()
_users = 0
_ours = False  # memwatch called tracemalloc.start(): it stops it when its last user leaves


def _acquire(frames: int) -> tuple[bool, int]:
    """Start tracing unless something already traces; (was it already tracing, frame limit)."""
    global _users, _ours
    with _lock:
        was = tracemalloc.is_tracing()
        if not was:
            tracemalloc.start(frames)
            _ours = True
        _users += 1
        return was, tracemalloc.get_traceback_limit()


def _release() -> None:
    global _users, _ours
    with _lock:
        _users = max(_users - 1, 0)
        if _users == 0 and _ours:
            _ours = False
            if tracemalloc.is_tracing():
                tracemalloc.stop()


def after_fork_in_child() -> None:
    """In a forked child (a DataLoader worker): stop tracing that memwatch started there.

    Nothing reads it in the child, and every allocation the worker makes would pay for it.
    """
    global _users, _ours
    if _ours and tracemalloc.is_tracing():
        tracemalloc.stop()
    _users, _ours = 0, False


def owns_tracing() -> bool:
    """Whether memwatch started the tracing that runs now (and will stop it)."""
    return _ours and tracemalloc.is_tracing()


# --------------------------------------------------------------------------- records
@dataclasses.dataclass
class _Site:
    """One allocation site's live blocks at one epoch end."""

    size: int
    count: int
    traceback: Frames  # the largest traceback's frames, innermost first
    tb_size: int


@dataclasses.dataclass
class _Record:
    epoch: int
    step: int
    rss: float | None
    overhead: int
    total: int
    sites: dict[tuple[str, int], _Site]
    own: float = 0.0  # RSS that memwatch's own work at this epoch end added


# --------------------------------------------------------------------------- the tracer
class AllocationTracer:
    """Starts tracemalloc (unless it runs already), diffs allocation sites at epoch ends.

    ``epoch_end`` returns the diff against the previous epoch end (None the first time) and keeps
    it as :attr:`last`; it raises on failure (the session disables the feature then).
    """

    def __init__(self, frames: int = DEFAULT_FRAMES, key: str = "traceback") -> None:
        if key not in ("traceback", "lineno"):
            raise ValueError(f"key={key!r}: use 'traceback' or 'lineno'")
        self.frames = frames
        self.key = key
        self.was_tracing = False  # the user's tracing: used, never stopped
        self.limit = frames  # the frame limit in effect (the user's when they started it)
        self.last: AllocationDiff | None = None
        self.collected_epoch: int | None = None  # gc.collect() ran at this epoch end
        self._prev: _Record | None = None
        self._started = False
        self._cwd = os.getcwd()
        self._proc: Any = None

    def start(self) -> AllocationTracer:
        if not self._started:
            self.was_tracing, self.limit = _acquire(self.frames)
            self._started = True
        return self

    def close(self) -> None:
        """Release tracing (stopped if memwatch started it and nobody else uses it). Idempotent."""
        self._prev = None
        self.last = None
        if self._started:
            self._started = False
            _release()

    @property
    def active(self) -> bool:
        return self._started

    def epoch_end(self, epoch: int, step: int, rss: float | None) -> AllocationDiff | None:
        """Snapshot now; the diff against the previous epoch end's snapshot (None the first time).

        Raises when tracing was stopped under us (the caller disables the feature).
        """
        if not self._started:
            return None
        if not tracemalloc.is_tracing():
            raise RuntimeError("tracemalloc was stopped by someone else")
        t0 = time.perf_counter()
        rss0 = self._rss()
        # Garbage cycles not yet collected would read as live growth.
        gc.collect()
        gc_ms = (time.perf_counter() - t0) * 1000.0
        self.collected_epoch = epoch
        snap = tracemalloc.take_snapshot()
        overhead = tracemalloc.get_tracemalloc_memory()
        sites, total = self._group(snap)
        del snap
        rec = _Record(epoch, step, rss_or_none(rss), overhead, total, sites)
        rss1 = self._rss()
        if rss0 is not None and rss1 is not None:
            rec.own = max(rss1 - rss0, 0.0)
        prev, self._prev = self._prev, rec
        if prev is None:
            self.last = None
            return None
        self.last = self._diff(prev, rec, t0)
        self.last.gc_ms = gc_ms
        return self.last

    def note_own_rss(self, epoch: int, nbytes: float) -> None:
        """RSS that other memwatch work at this epoch end added (the analyzer's census runs
        under tracing too); the next diff does not count it as the user's."""
        if self._prev is not None and self._prev.epoch == epoch and nbytes > 0:
            self._prev.own += nbytes

    def rss(self) -> float | None:
        """This process's RSS now (bytes), None where it cannot be read."""
        return self._rss()

    # ------------------------------------------------------------------ internals
    def _rss(self) -> float | None:
        try:
            if self._proc is None:
                import psutil

                self._proc = psutil.Process()
            return float(self._proc.memory_info().rss)
        except Exception:  # noqa: BLE001 - only a correction is lost
            return None

    def _group(self, snap: tracemalloc.Snapshot) -> tuple[dict[tuple[str, int], _Site], int]:
        """Live blocks per site: the innermost frame of user code (else the innermost frame)."""
        sites: dict[tuple[str, int], _Site] = {}
        total = 0
        for frames, size, count in group_traces(snap, self.key):
            if any(excluded(f) for f, _ in frames):
                continue
            total += size
            site = next((fr for fr in frames if is_user_file(fr[0])), frames[0]) if frames \
                else ("<unknown>", 0)
            s = sites.get(site)
            if s is None:
                sites[site] = _Site(size, count, frames, size)
            else:
                s.size += size
                s.count += count
                if size > s.tb_size:
                    s.traceback, s.tb_size = frames, size
        return sites, total

    def _diff(self, prev: _Record, cur: _Record, t0: float) -> AllocationDiff:
        growths: list[SiteGrowth] = []
        growth_sum = 0
        for key, s in cur.sites.items():
            p = prev.sites.get(key)
            db = s.size - (p.size if p is not None else 0)
            if db <= 0:
                continue
            growth_sum += db
            dc = s.count - (p.count if p is not None else 0)
            growths.append(SiteGrowth(file=key[0], line=key[1], user=is_user_file(key[0]),
                                      bytes_delta=db, count_delta=dc, size=s.size,
                                      count=s.count, traceback=s.traceback))
        growths.sort(key=lambda g: g.bytes_delta, reverse=True)
        growths = growths[:TOP_SITES]
        for g in growths:
            g.where = f"{short_path(g.file, self._cwd)}:{g.line}"
        rss_growth = None
        # memwatch's share: tracemalloc's tables, and what the previous epoch end's work added
        # (the allocator may hand that memory to the user's allocations since: at most all of
        # the growth is ours).
        own = prev.own + TRACE_RSS_FACTOR * max(cur.overhead - prev.overhead, 0)
        if cur.rss is not None and prev.rss is not None:
            rss_growth = float(cur.rss - prev.rss)
            own = min(own, max(rss_growth, 0.0))
        return AllocationDiff(
            epochs=(prev.epoch, cur.epoch), steps=max(cur.step - prev.step, 0), growths=growths,
            traced_growth=growth_sum, traced_net=cur.total - prev.total, traced_bytes=cur.total,
            rss_growth=rss_growth, overhead_growth=cur.overhead - prev.overhead,
            own_rss_growth=own,
            overhead_bytes=cur.overhead, sites=len(cur.sites), frames=self.limit,
            elapsed_ms=(time.perf_counter() - t0) * 1000.0,
        )


def _is_nan(x: float | None) -> bool:
    return x is None or x != x


def rss_or_none(value: float | None) -> float | None:
    """A host.rss reading, None when missing or NaN."""
    return None if _is_nan(value) else value


__all__ = ["DEFAULT_FRAMES", "MAX_FRAMES", "AllocationDiff", "AllocationTracer", "SiteGrowth",
           "after_fork_in_child", "owns_tracing"]
