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

    >>> from memwatch.analysis.allocations import AllocationTracer
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

import ast
import dataclasses
import functools
import gc
import importlib
import linecache
import operator
import os
import sysconfig
import threading
import time
import tracemalloc
from typing import Any

import numpy as np

#: Frames kept per allocation with ``tracemalloc=True``: enough to reach user code from inside
#: most library calls (``json.loads`` is 3 deep, ``copy.deepcopy`` 2 per level of nesting). Each
#: frame costs time on every allocation: 1.6 us per allocation with 8 frames, 2.6 us with 16,
#: 0.64 us with 1, against 0.04 us untraced (CPython 3.11, allocations 20 frames deep;
#: ``benchmarks/bench_tracemalloc_cost.py``).
DEFAULT_FRAMES = 8
#: More frames cost more per allocation and name nothing more.
MAX_FRAMES = 256
#: Sites kept in a diff (the largest growth first).
TOP_SITES = 10
#: Frames shown in a site's short traceback.
SHORT_TRACEBACK = 6
#: RSS per byte that ``tracemalloc.get_tracemalloc_memory()`` reports: it counts its tables, not
#: the allocator's headers around each of their entries (measured: 97 bytes of RSS per traced
#: block against 49 reported, glibc x86-64, CPython 3.11).
TRACE_RSS_FACTOR = 2.0

#: A traceback as tracemalloc keeps it: (file, line) pairs, innermost first.
Frames = tuple[tuple[str, int], ...]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TRACEMALLOC_FILE = os.path.abspath(tracemalloc.__file__ or "tracemalloc.py")
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__ or "importlib")) + os.sep

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


# --------------------------------------------------------------------------- frames and files
def _library_prefixes() -> tuple[str, ...]:
    paths = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            p = sysconfig.get_paths().get(name)
        except Exception:  # noqa: BLE001 - an odd installation: fall back on the markers
            p = None
        if p:
            paths.add(os.path.abspath(p) + os.sep)
    return tuple(sorted(paths))


_LIBRARY = _library_prefixes()


@functools.lru_cache(maxsize=4096)
def _excluded(filename: str) -> bool:
    """memwatch's own allocations, tracemalloc's and the import system's are never a culprit."""
    return (filename.startswith(_PKG_DIR) or filename == _TRACEMALLOC_FILE
            or filename.startswith("<frozen importlib") or filename.startswith(_IMPORTLIB_DIR))


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Code the user wrote: not the standard library, an installed package or memwatch."""
    if filename.startswith("<"):
        return not filename.startswith(("<frozen", "<unknown"))  # "<string>", "<stdin>": user
    if _excluded(filename) or "site-packages" in filename or "dist-packages" in filename:
        return False
    return not filename.startswith(_LIBRARY)


def short_path(filename: str, cwd: str | None = None) -> str:
    """``train.py`` (relative to the working directory), ``torch/nn/modules/module.py`` (inside
    an installed package), ``json/decoder.py`` (the standard library), else the last two parts."""
    if filename.startswith("<"):
        return filename
    cwd = cwd if cwd is not None else os.getcwd()
    if filename.startswith(cwd.rstrip(os.sep) + os.sep):
        return filename[len(cwd.rstrip(os.sep)) + 1:]
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in filename:
            return filename.split(marker, 1)[1]
    for prefix in _LIBRARY:
        if filename.startswith(prefix):
            return filename[len(prefix):]
    parts = filename.split(os.sep)
    return os.sep.join(parts[-2:])


@functools.lru_cache(maxsize=64)
def _function_spans(filename: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, qualified name) of every function in a source file."""
    lines = linecache.getlines(filename)
    if not lines:
        return ()
    try:
        tree = ast.parse("".join(lines), filename)
    except (SyntaxError, ValueError):
        return ()
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    spans.append((first, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return tuple(spans)


def function_at(filename: str, line: int) -> str | None:
    """The innermost function defined around ``line``; ``<module>`` at module level."""
    best: tuple[int, int, str] | None = None
    spans = _function_spans(filename)
    for span in spans:
        if span[0] <= line <= span[1] and (best is None or span[0] >= best[0]):
            best = span
    if best is not None:
        return best[2]
    return "<module>" if spans or linecache.getline(filename, line) else None


# --------------------------------------------------------------------------- results
@dataclasses.dataclass
class _Site:
    """One allocation site's live blocks at one epoch end."""

    size: int
    count: int
    traceback: Frames  # the largest traceback's frames, innermost first
    tb_size: int


@dataclasses.dataclass
class SiteGrowth:
    """Growth of the live blocks allocated at one site (file:line) between two epoch ends."""

    file: str
    line: int
    user: bool  # the innermost frame of user code (else the innermost frame: no user frame)
    bytes_delta: int
    count_delta: int
    size: int  # live bytes allocated here, now
    count: int  # live blocks allocated here, now
    traceback: Frames
    function: str | None = None
    code: str | None = None
    where: str = ""  # "train.py:42"

    _resolved: bool = dataclasses.field(default=False, init=False, repr=False)

    def resolve(self) -> SiteGrowth:
        """Look up the function and the line of source (user code only: linecache keeps every
        file it reads, and a library's line says little about the user's bug). Done when a
        finding names the site, not at every epoch end: parsing a file costs memory and time."""
        if not self._resolved:
            self._resolved = True
            if self.user:
                self.function = function_at(self.file, self.line)
                self.code = linecache.getline(self.file, self.line).strip()[:160] or None
        return self

    def describe_where(self) -> str:
        self.resolve()
        return f"{self.where} in {self.function}" if self.function else self.where

    def to_dict(self, steps: int) -> dict[str, Any]:
        self.resolve()
        return {
            "where": self.where,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "code": self.code,
            "user_code": self.user,
            "traceback": [f"{short_path(f)}:{n}" for f, n in self.traceback[:SHORT_TRACEBACK]],
            "bytes_delta": self.bytes_delta,
            "count_delta": self.count_delta,
            "bytes_per_step": self.bytes_delta / steps if steps > 0 else None,
            "live_bytes": self.size,
            "live_blocks": self.count,
        }


@dataclasses.dataclass
class AllocationDiff:
    """What grew between two epoch ends, by allocation site (largest growth first)."""

    epochs: tuple[int, int]
    steps: int
    growths: list[SiteGrowth]  # positive bytes_delta only, at most TOP_SITES
    traced_growth: int  # sum of every site's positive growth (bytes)
    traced_net: int  # change of all traced user-visible bytes (growth minus releases)
    traced_bytes: int  # traced bytes now (memwatch's own excluded)
    rss_growth: float | None  # the process's RSS over the same interval
    overhead_growth: int  # tracemalloc's own bookkeeping over the interval (as it reports it)
    own_rss_growth: float  # memwatch's share of rss_growth while tracing (see below)
    overhead_bytes: int  # tracemalloc's own bookkeeping now
    sites: int
    frames: int
    elapsed_ms: float  # gc.collect + snapshot + grouping + diff at this epoch end
    gc_ms: float = 0.0  # of which gc.collect() (the census skips its own after it)

    def explainable_rss_growth(self) -> float | None:
        """RSS growth less memwatch's own: tracemalloc's bookkeeping and the previous epoch
        end's work (a snapshot makes Python objects of every trace; the allocator keeps some)."""
        if self.rss_growth is None:
            return None
        return self.rss_growth - self.own_rss_growth

    def summary(self) -> dict[str, Any]:
        return {
            "epochs": list(self.epochs),
            "steps": self.steps,
            "traced_growth_bytes": self.traced_growth,
            "traced_net_bytes": self.traced_net,
            "traced_bytes": self.traced_bytes,
            "rss_growth_bytes": self.rss_growth,
            "tracemalloc_overhead_growth_bytes": self.overhead_growth,
            "tracemalloc_overhead_rss_bytes": TRACE_RSS_FACTOR * max(self.overhead_growth, 0),
            "tracemalloc_overhead_bytes": self.overhead_bytes,
            "memwatch_rss_growth_bytes": self.own_rss_growth,
            "sites": self.sites,
            "frames": self.frames,
            "snapshot_ms": round(self.elapsed_ms, 1),
            "gc_collect_ms": round(self.gc_ms, 1),
        }


@dataclasses.dataclass
class _Record:
    epoch: int
    step: int
    rss: float | None
    overhead: int
    total: int
    sites: dict[tuple[str, int], _Site]
    own: float = 0.0  # RSS that memwatch's own work at this epoch end added


# --------------------------------------------------------------------------- grouping

def group_traces(snap: tracemalloc.Snapshot,
                 key: str = "traceback") -> list[tuple[Frames, int, int]]:
    """(frames innermost first, bytes, blocks) per traceback (``key="lineno"``: per innermost
    line) of a snapshot.

    ``Snapshot.statistics`` does the same in Python, adding to an int per trace: with tracing
    on, every one of those ints is itself a traced allocation (8.1 s for a million traces of 8
    frames, measured). Here the per-trace work allocates nothing: a dict lookup per trace gives
    its group's index, numpy sums the sizes (0.21 s by traceback, 0.09 s by line, for the same
    snapshot). Falls back on ``statistics`` if the snapshot's raw traces are not the (domain,
    size, traceback, ...) tuples CPython 3.9+ keeps.
    """
    raw = getattr(getattr(snap, "traces", None), "_traces", None)
    if not isinstance(raw, list) or (raw and not (
            isinstance(raw[0], tuple) and len(raw[0]) >= 3 and isinstance(raw[0][2], tuple)
            and raw[0][2] and isinstance(raw[0][2][0], tuple))):
        return [(tuple((f.filename, f.lineno) for f in reversed(st.traceback)), st.size,
                 st.count) for st in snap.statistics(key)]
    if not raw:
        return []
    tb_of = operator.itemgetter(2)
    if key == "lineno":
        first = operator.itemgetter(0)

        def keys() -> Any:
            return map(first, map(tb_of, raw))
    else:
        def keys() -> Any:
            return map(tb_of, raw)

    uniq = list(set(keys()))
    index = {k: i for i, k in enumerate(uniq)}
    group = np.fromiter(map(index.__getitem__, keys()), np.intp, len(raw))
    # int64, not float64: fromiter would make a float object of every size on the way.
    sizes = np.fromiter(map(operator.itemgetter(1), raw), np.int64, len(raw))
    total = np.bincount(group, weights=sizes, minlength=len(uniq)).astype(np.int64).tolist()
    count = np.bincount(group, minlength=len(uniq)).tolist()
    del group, sizes
    if key == "lineno":
        return [((k,), total[i], count[i]) for i, k in enumerate(uniq)]
    return list(zip(uniq, total, count, strict=True))


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
            if any(_excluded(f) for f, _ in frames):
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
           "after_fork_in_child", "function_at", "is_user_file", "owns_tracing", "short_path"]
