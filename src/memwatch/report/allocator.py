"""The allocator's state at the failure, read from an allocator snapshot.

A snapshot is the plain-data dict of ``torch.cuda.memory._snapshot()`` (``FakeDevice.snapshot()``
has the same shape), loaded from a bundle's ``snapshot.pickle`` with
:mod:`memwatch.core.safepickle`:

* ``segments``: one dict per segment the caching allocator holds from the driver (``address``,
  ``total_size``, ``allocated_size``, ``segment_type``, ``blocks``: each block's ``size``,
  ``requested_size``, ``state`` and, with allocation history on, the ``frames`` that allocated it);
* ``device_traces``: per device, the allocation history (``action`` in ``alloc``,
  ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``oom``...; ``addr``,
  ``size``, ``frames``), empty unless history recording was on (``record_history=True``).

Everything here tolerates missing or odd fields: a snapshot of another torch version yields fewer
rows, never an exception.

Example::

    >>> from memwatch.testing import FakeDevice
    >>> from memwatch.report.allocator import segments_view
    >>> dev = FakeDevice(total_bytes=64 * 2**20)
    >>> h = dev.malloc(3 * 2**20)
    >>> v = segments_view(dev.snapshot())
    >>> v["segments"][0]["total"], v["fragmentation"]["largest_free"]
    (20971520, 17825792)
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["history_view", "segments_view"]

#: Rows in each table (largest first).
TOP_N = 15
#: Points of the allocation timeline (events beyond this are thinned to their running maximum).
MAX_TIMELINE_POINTS = 2000


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def segments_view(snapshot: Any, request: int | None = None) -> dict[str, Any] | None:
    """Segments, largest blocks and fragmentation figures, or None without segments.

    ``request`` (bytes the failing allocation asked for, from the OOM message) lets the
    fragmentation line say whether free memory would have sufficed had it been contiguous.
    """
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        return None
    segs: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    for i, seg in enumerate(snapshot["segments"]):
        if not isinstance(seg, dict):
            continue
        total = _int(seg.get("total_size"))
        alloc = 0
        free_blocks = 0
        for b in seg.get("blocks") or []:
            if not isinstance(b, dict):
                continue
            size = _int(b.get("size"))
            state = str(b.get("state", ""))
            live = state.startswith("active")
            if live:
                alloc += size
            else:
                free_blocks += 1
            blocks.append({"segment": i, "size": size, "requested": _int(b.get("requested_size")),
                           "state": state, "live": live, "stack": _stack(b.get("frames"))})
        if not alloc:
            alloc = _int(seg.get("allocated_size"))
        segs.append({"index": i, "address": _int(seg.get("address")), "total": total,
                     "allocated": alloc, "free": max(total - alloc, 0),
                     "type": str(seg.get("segment_type", "")), "free_blocks": free_blocks})
    reserved = sum(s["total"] for s in segs)
    allocated = sum(s["allocated"] for s in segs)
    free = [b["size"] for b in blocks if not b["live"]]
    free_total = sum(free)
    largest_free = max(free, default=0)
    frag = {
        "segments": len(segs),
        "reserved": reserved,
        "allocated": allocated,
        "free_in_segments": reserved - allocated,
        "largest_free": largest_free,
        "free_blocks": len(free),
        # 0 when all free memory is one block; near 1 when it is scattered in small pieces.
        "ratio": (1.0 - largest_free / free_total) if free_total else 0.0,
        "request": request,
    }
    return {
        "segments": segs,
        "largest_live": sorted((b for b in blocks if b["live"]), key=lambda b: -b["size"])[:TOP_N],
        "largest_free": sorted((b for b in blocks if not b["live"]),
                               key=lambda b: -b["size"])[:TOP_N],
        "fragmentation": frag,
    }


def _frame_text(fr: Any) -> str:
    if not isinstance(fr, dict):
        return str(fr)
    return f"{fr.get('name', '?')} ({fr.get('filename', '?')}:{fr.get('line', '?')})"


def _stack(frames: Any, depth: int = 6) -> str:
    """The most useful frames of an allocation's stack, innermost first, as one string.

    Allocator-internal and torch-internal frames (C++ and torch/ Python files) say nothing about
    who allocated: user frames are listed first, the rest only when no user frame exists.
    """
    if not isinstance(frames, list) or not frames:
        return ""
    frs = [f for f in frames if isinstance(f, dict)]
    user = [f for f in frs if _is_user_frame(f)]
    chosen = (user or frs)[:depth]
    return " <- ".join(_frame_text(f) for f in chosen)


def _is_user_frame(fr: dict[str, Any]) -> bool:
    fn = str(fr.get("filename", ""))
    if not fn.endswith(".py"):
        return False  # C++ frames (c10/, ATen, ??)
    return "/torch/" not in fn and "/site-packages/" not in fn and "/memwatch/" not in fn


def history_view(snapshot: Any) -> dict[str, Any] | None:
    """Allocation timeline and largest allocations by stack, or None without history.

    The timeline replays ``alloc`` / ``free_completed`` events into the bytes allocated after each
    event (what PyTorch's memory viz calls the active memory timeline); the stack table sums the
    bytes of the allocations still live at the end of the history by their user stack.
    """
    if not isinstance(snapshot, dict):
        return None
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        return None
    events = [e for dev in traces if isinstance(dev, list) for e in dev if isinstance(e, dict)]
    if not any(e.get("action") == "alloc" for e in events):
        return None
    live: dict[int, tuple[int, str]] = {}
    total = 0
    xs: list[int] = []
    ys: list[int] = []
    ooms: list[int] = []
    by_stack_all: collections.Counter[str] = collections.Counter()
    for i, e in enumerate(events):
        action = e.get("action")
        addr, size = _int(e.get("addr")), _int(e.get("size"))
        if action == "alloc":
            stack = _stack(e.get("frames")) or "(no stack recorded)"
            live[addr] = (size, stack)
            total += size
            by_stack_all[stack] += size
        elif action == "free_completed":
            got = live.pop(addr, None)
            total -= got[0] if got else 0
        elif action == "oom":
            ooms.append(i)
        else:
            continue
        xs.append(i)
        ys.append(total)
    if len(xs) > MAX_TIMELINE_POINTS:
        k = -(-len(xs) // MAX_TIMELINE_POINTS)
        xs2, ys2 = [], []
        for j in range(0, len(xs), k):
            w = ys[j:j + k]
            xs2.append(xs[j + w.index(max(w))])
            ys2.append(max(w))
        xs, ys = xs2, ys2
    live_by_stack: dict[str, list[int]] = {}
    for size, stack in live.values():
        agg = live_by_stack.setdefault(stack, [0, 0])
        agg[0] += size
        agg[1] += 1
    ranked = sorted(live_by_stack.items(), key=lambda kv: -kv[1][0])[:TOP_N]
    top_live = [{"stack": s, "bytes": v[0], "count": v[1]} for s, v in ranked]
    top_all = [{"stack": s, "bytes": b} for s, b in by_stack_all.most_common(TOP_N)]
    return {"events": len(events), "x": xs, "y": ys, "oom_events": ooms,
            "live_at_end": total, "top_live": top_live, "top_allocated": top_all}
