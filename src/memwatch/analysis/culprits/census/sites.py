"""Allocation sites: which lines of user code allocated the Python memory that is still alive.

The pieces :mod:`.allocations` diffs at every check: how a file's path reads, the function
around a line, the growth of one site (:class:`SiteGrowth`) and of all of them
(:class:`AllocationDiff`), and :func:`group_traces`, which sums a tracemalloc snapshot by
traceback without allocating per trace. Whose file it is: :mod:`.ownership`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import linecache
import operator
import os
import tracemalloc
from typing import Any

import numpy as np

from memwatch.analysis.culprits.census.ownership import excluded, is_user_file, library_prefixes

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

_LIBRARY = library_prefixes()


# --------------------------------------------------------------------------- frames and files
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

    def explains(self, min_bytes: float, share: float) -> bool:
        """Live traced Python allocations grew by at least ``share`` of the host growth (at
        least ``min_bytes`` when that growth is unknown): user code keeps them (a leak), the
        allocator does not (retention)."""
        grew = min(self.traced_growth, self.traced_net)  # net: what was released elsewhere
        if grew <= 0:
            return False
        rss = self.explainable_rss_growth()
        if rss is None or rss <= 0:
            return bool(grew >= min_bytes)
        return bool(grew >= share * rss)

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


__all__ = ["SHORT_TRACEBACK", "TOP_SITES", "TRACE_RSS_FACTOR", "AllocationDiff", "Frames",
           "SiteGrowth", "excluded", "function_at", "group_traces", "is_user_file",
           "short_path"]
