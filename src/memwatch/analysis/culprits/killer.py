"""The killer in the bundle: at a failure, what holds the memory that grew since the last check.

An out-of-memory bundle's census lists the largest tensor groups, which says what is big, not
what grew nor who keeps it: a rank that died allocating a list of 26 tensors of 64 MiB showed
them with no holder, and with ``bytearray`` s instead the 1.6 GiB appeared nowhere. At a failure
:func:`name_killer` takes a census now and diffs it against the last one a check took (of any
session of this process: :func:`remember`, called by the live evidence), adds a census of large
Python buffers (``bytes``, ``bytearray``, numpy: :mod:`.census.large`) and the C allocator's
in-use bytes against the last check's, and names who holds each of the largest growths with
the holder walk. Bounded in CPU time (``budget_s``) and in size (``top`` entries).

The result is a JSON-able dict (``census.json["killer"]`` in a bundle)::

    {"since": {"epoch": 3, "step": 120} | None, "in_use_growth_bytes": ...,
     "held": [{"what": "26 x float32[16777216] on cpu", "kind": "tensors", "bytes": ...,
               "count": 26, "holder": "run() (train.py:40): local hog", "holder_name": "hog",
               "container": "list", "container_len": 26}, ...],
     "note": "...", "elapsed_ms": ...}
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from memwatch.analysis.culprits.census import census as census_mod
from memwatch.analysis.culprits.census.large import large_buffers, nbytes
from memwatch.analysis.culprits.growth import weigh
from memwatch.analysis.culprits.holders import holders as holders_mod
from memwatch.analysis.culprits.holders.untracked import ArrayBases
from memwatch.analysis.evidence import CensusRecord, Holder
from memwatch.core.units import fmt_bytes
from memwatch.probes.malloc import MallocInfo

__all__ = ["in_use", "name_killer", "remember"]

#: The last census a check of this process took (weakly: it dies with its session), and the C
#: allocator's in-use bytes then.
_last: list[Any] = [None, None]
#: Growths smaller than this are nobody's OOM: not walked.
MIN_GROWTH = 1 << 20


def remember(rec: CensusRecord, in_use: float | None) -> None:
    """Keep (weakly) the census a check just took, with the allocator's in-use bytes then."""
    _last[0] = weakref.ref(rec)
    _last[1] = in_use


def _previous() -> tuple[CensusRecord | None, float | None]:
    ref = _last[0]
    rec = ref() if ref is not None else None
    return rec, _last[1] if rec is not None else None


def in_use() -> float | None:
    """The C allocator's in-use bytes now (None where glibc's ``mallinfo2`` is missing)."""
    if _malloc[0] is None:
        _malloc[0] = MallocInfo.open() or False
    info = _malloc[0]
    try:
        return info.read()["host.malloc_in_use"] if info else None
    except Exception:  # noqa: BLE001 - evidence only
        return None


_malloc: list[Any] = [None]


def name_killer(budget_s: float = 1.0, top: int = 6,
                cur: census_mod.Census | None = None) -> dict[str, Any]:
    """What holds the memory that grew since the last check's census (every device), with the
    large Python buffers alive now, each with its holder; see the module doc. ``cur``: a
    census taken a moment ago (else one is taken)."""
    t0 = time.perf_counter()
    deadline = time.thread_time() + budget_s
    prev, in_use_then = _previous()
    in_use_now = in_use()
    if cur is None:
        cur = census_mod.take_census(collect=False, count_types=False)
    # (bytes, kind, the id of the object to walk from, the entry)
    cands: list[tuple[int, str, int, dict[str, Any]]] = []
    if prev is not None:
        growths = census_mod.diff(prev.census, cur)
    else:
        growths = [census_mod.GroupGrowth(g, g.count, g.bytes, g.ids)
                   for g in sorted(cur.groups.values(), key=lambda g: g.bytes, reverse=True)]
    for g in growths[:top]:
        grown = g.effective_bytes
        ids = g.new_ids or g.group.ids
        if grown < MIN_GROWTH or not ids:
            continue
        what = f"{g.count_delta} × {g.group.describe()}" if g.count_delta > 0 else \
            g.group.describe()
        cands.append((grown, "tensors", ids[len(ids) // 2],
                      {"what": what, "kind": "tensors", "bytes": grown,
                       "count": max(g.count_delta, 0)}))
    out: dict[str, Any] = {
        "since": {"epoch": prev.epoch, "step": prev.step} if prev is not None else None,
        "tensor_growth_bytes": sum(max(g.effective_bytes, 0) for g in growths),
        "in_use_growth_bytes": (in_use_now - in_use_then)
        if in_use_now is not None and in_use_then is not None else None,
    }
    big = large_buffers(budget_s=max(deadline - time.thread_time(), 0.1) / 2)
    # Every object a walk starts from, in one dict the walks are told to ignore (a container
    # of ours must never be what they find holding it).
    objs = weigh.objects_for({c[2] for c in cands})
    for _, bufs in big.groups[:top]:
        size = sum(map(nbytes, bufs))
        kinds = sorted({_buffer_kind(b) for b in bufs})
        objs[id(bufs[0])] = bufs[0]
        cands.append((size, "buffers", id(bufs[0]),
                      {"what": f"{len(bufs)} {' and '.join(kinds)} of "
                               f"{fmt_bytes(size / len(bufs))} on average",
                       "kind": "buffers", "bytes": size, "count": len(bufs),
                       "alive_now": True}))
    found = {"count": big.count, "bytes": big.total_bytes, "truncated": big.truncated}
    big.close()
    arrays = ArrayBases(budget_s=0.5)
    held: list[dict[str, Any]] = []
    try:
        cands.sort(key=lambda c: c[0], reverse=True)
        seen: dict[str, dict[str, Any]] = {}
        for size, _kind, target_id, entry in cands[:top]:
            target = objs.pop(target_id, None)
            h: Holder | None = None
            if target is not None and time.thread_time() < deadline:
                h, why = holders_mod.walk(
                    target, budget_s=max(deadline - time.thread_time(), 0.1),
                    ignore=(id(objs), id(cands)), arrays=arrays)
                if why == holders_mod.OWN:
                    continue  # memwatch's own
            del target
            if h is not None:
                entry.update(holder=h.path, holder_name=h.name, holder_root=h.root,
                             container=h.container, container_len=h.container_len)
                same = seen.get(h.path)
                if same is not None:  # one holder, two ways of seeing its growth
                    same["bytes"] = max(same["bytes"], size)
                    continue
                seen[h.path] = entry
            held.append(entry)
    finally:
        arrays.close()
        objs.clear()
    held.sort(key=lambda e: e["bytes"], reverse=True)
    out["held"] = held
    out["large_buffers"] = found
    out["note"] = _note(prev, held, out["in_use_growth_bytes"], out["tensor_growth_bytes"])
    out["elapsed_ms"] = round((time.perf_counter() - t0) * 1000.0, 1)
    return out


def _buffer_kind(b: Any) -> str:
    if type(b) is bytes:
        return "bytes objects"
    return "bytearrays" if type(b) is bytearray else "numpy arrays"


def _note(prev: CensusRecord | None, held: list[dict[str, Any]], in_use: float | None,
          tensors: float) -> str:
    """One sentence: what the killer is, or why none is named."""
    since = (f"since the check at step {prev.step}" if prev is not None else
             "(no check took a census before the failure: the largest alive now)")
    grew = ""
    if in_use is not None and prev is not None:
        grew = (f"The C allocator's in-use bytes grew by {fmt_bytes(in_use)} {since} (live "
                f"tensors by {fmt_bytes(tensors)}). ")
    if not held:
        return grew + f"No tensor or large Python buffer of {fmt_bytes(MIN_GROWTH)} or more " \
            f"grew {since}."
    first = held[0]
    by = f", held by {first['holder']}" if first.get("holder") else ", with no holder named"
    when = "alive now (large Python buffers are not counted at checks)" \
        if first.get("alive_now") else f"grew {since}"
    return f"{grew}{first['what']} ({fmt_bytes(first['bytes'])}) {when}{by}."
