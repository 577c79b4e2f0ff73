"""A census of large Python buffers: ``bytes``, ``bytearray`` and numpy arrays that own their
memory, from :data:`MIN_BYTES` each.

None of them is tracked by the collector, so the tensor census never sees them: they are found
among the referents of the objects it tracks (one pass over the heap, 150-200 ms on a
framework's heap of 380,000 objects, CPU: taken where a failure justifies it, never per check),
and grouped by the container that holds them, so that one holder walk names each group.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

from memwatch.analysis.culprits.census.ownership import is_own_file

__all__ = ["MIN_BYTES", "LargeBuffers", "UntrackedScan", "large_buffers"]

#: Buffers from this size are counted one by one (a page-sized string is nobody's OOM).
MIN_BYTES = 1 << 20
_CHUNK = 8192


@dataclasses.dataclass
class LargeBuffers:
    """Large buffers alive now, by the object that holds them (a list, a dict, an instance)."""

    #: (the holding object, its buffers), the most bytes first; the objects are kept alive
    #: until :meth:`close`.
    groups: list[tuple[Any, list[Any]]] = dataclasses.field(default_factory=list)
    total_bytes: int = 0
    count: int = 0
    truncated: bool = False  # the pass stopped at its budget: what was found so far
    elapsed_ms: float = 0.0

    def close(self) -> None:
        for _, bufs in self.groups:
            bufs.clear()
        self.groups.clear()


class UntrackedScan:
    """The objects of the ``wanted`` types that the collector's objects refer to: what it does
    not track itself (``bytes``, ``bytearray``, numpy arrays), found a chunk of the heap at a
    time (one C call each) until ``deadline`` (CPU time of this thread, ``time.thread_time()``);
    ``truncated`` says the pass stopped there (what was found so far was given)."""

    def __init__(self, wanted: set[type], deadline: float) -> None:
        self.wanted = wanted
        self.deadline = deadline
        self.truncated = False

    def __iter__(self) -> Iterator[Any]:
        wanted = self.wanted
        objs = gc.get_objects()
        try:
            for i in range(0, len(objs), _CHUNK):
                if time.thread_time() > self.deadline:
                    self.truncated = True
                    return
                refs = gc.get_referents(*objs[i:i + _CHUNK])
                yield from itertools.compress(refs, map(wanted.__contains__, map(type, refs)))
                del refs
        finally:
            del objs


def nbytes(obj: Any) -> int:
    """A buffer's bytes: its length for ``bytes``/``bytearray``, ``nbytes`` for an array."""
    if type(obj) in (bytes, bytearray):
        return len(obj)
    return int(getattr(obj, "nbytes", 0) or 0)


def large_buffers(min_bytes: int = MIN_BYTES, budget_s: float = 1.0,
                  limit: int = 256) -> LargeBuffers:
    """The ``bytes``, ``bytearray`` and owning numpy arrays of at least ``min_bytes`` alive now
    (at most ``limit``, the largest), grouped by what refers to them. Arrays over a tensor's
    storage are left to the tensor census; views count their owning array."""
    t0 = time.perf_counter()
    deadline = time.thread_time() + budget_s
    out = LargeBuffers()
    np = sys.modules.get("numpy")
    wanted: set[type] = {bytes, bytearray}
    if np is not None:
        wanted.add(np.ndarray)
    found: dict[int, Any] = {}
    scan = UntrackedScan(wanted, deadline)
    for b in scan:
        owner = _owner(b, np)
        if owner is not None and id(owner) not in found and nbytes(owner) >= min_bytes:
            found[id(owner)] = owner
    out.truncated = scan.truncated
    bufs = sorted(found.values(), key=nbytes, reverse=True)[:limit]
    found.clear()
    out.count = len(bufs)
    out.total_bytes = sum(map(nbytes, bufs))
    out.groups = _by_holder(bufs)
    bufs.clear()
    out.elapsed_ms = (time.perf_counter() - t0) * 1000.0
    return out


def _owner(b: Any, np: Any) -> Any | None:
    """The object that owns a buffer's memory (an array's base followed down), None for an
    array over a tensor (the tensor census counts it) or over memory nothing here owns."""
    if type(b) in (bytes, bytearray):
        return b
    root = b
    for _ in range(64):
        base = root.base
        if base is None:
            return root
        if isinstance(base, np.ndarray):
            root = base
            continue
        if type(base) in (bytes, bytearray):
            return base  # np.frombuffer: the bytes object owns the memory
        return None  # a tensor's storage, a mmap, a C buffer
    return None  # a chain of views too long to follow


def _by_holder(bufs: list[Any]) -> list[tuple[Any, list[Any]]]:
    """Group buffers by the first object the collector tracks that refers to them (one pass
    over the heap for all), the most bytes first; a buffer nothing tracked refers to is a
    group of its own (held by a running frame, or by an array of a view)."""
    if not bufs:
        return []
    ids = {id(b): b for b in bufs}
    groups: dict[int, tuple[Any, list[Any]]] = {}
    placed: set[int] = set()
    refs = gc.get_referrers(*bufs)
    try:
        for r in refs:
            if r is bufs or r is ids or (isinstance(r, types.FrameType)
                                          and is_own_file(r.f_code.co_filename)):
                continue
            for x in gc.get_referents(r):
                if id(x) in ids and id(x) not in placed:
                    placed.add(id(x))
                    groups.setdefault(id(r), (r, []))[1].append(x)
    finally:
        refs.clear()
    for b in bufs:
        if id(b) not in placed:
            groups[id(b)] = (b, [b])
    ids.clear()
    return sorted(groups.values(), key=lambda g: sum(map(nbytes, g[1])), reverse=True)
