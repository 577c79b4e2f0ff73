"""Evidence taken at a failure, in one pass that never raises.

:func:`capture` takes everything that will not survive the stack unwinding (allocator statistics,
the allocator snapshot, a census of live tensors, the killer — what holds the memory that grew
since the last check: :mod:`memwatch.analysis.culprits.killer` — and a copy of the recent
timeline rows): from the device's out-of-memory observer it runs *inside* the failing
allocation. A part that fails is
recorded in ``Capture.errors`` and the rest goes on. It reads the session through its
read-only view (:class:`memwatch.core.protocols.SessionView`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from memwatch.bundle.documents import Capture
from memwatch.core.protocols import SessionView

__all__ = ["Capture", "capture"]


def _census(top_n: int, keep: list[Any]) -> dict[str, Any]:
    """The census's largest groups (``census.json``); the census itself goes into ``keep`` for
    the killer, which diffs it rather than taking another."""
    try:
        from memwatch.analysis.culprits.census.census import take_census
    except Exception as e:  # noqa: BLE001
        return {"error": f"census not available ({type(e).__name__}: {e})"}
    try:
        c = take_census()
        keep.append(c)
        return dict(c.to_dict(top_n))
    except Exception as e:  # noqa: BLE001
        return {"error": f"census failed ({type(e).__name__}: {e})"}


def _killer(keep: list[Any]) -> dict[str, Any]:
    """What holds the memory that grew since the last check (tensors and large Python
    buffers, with their holders): ``census.json["killer"]``."""
    from memwatch.analysis.culprits.killer import name_killer

    return name_killer(cur=keep[0] if keep else None)


def _copy_timeline(cap: Capture, tl: Any, max_rows: int) -> None:
    cap.keys = tuple(tl.keys)
    # Copies of the rows kept only (bounded by max_rows).
    cap.rows, cap.steps, cap.times = tl.recent(min(len(tl), max_rows))


def capture(view: SessionView, pre_unwind: bool, observer: dict[str, int] | None,
            timeline_rows: int, census_top_n: int, killer: bool = True) -> Capture:
    """Gather the evidence now. Never raises; failed parts land in ``errors``. ``killer``: name
    what held the memory that grew since the last check (an out-of-memory failure's)."""
    cap = Capture(wall=time.time(), mono=time.monotonic(), pre_unwind=pre_unwind,
                  thread=threading.current_thread().name, observer=observer)

    def part(name: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - one missing part never loses the bundle
            cap.errors[name] = f"{type(e).__name__}: {e}"
            return None

    cap.latest = part("latest", view.latest) or {}
    cap.limits = part("limits", view.limits) or {}
    dev = view.device
    if dev is not None:
        cap.memory_stats = part("memory_stats", dev.memory_stats)
        snap = getattr(dev, "snapshot", None)
        if snap is not None:
            cap.snapshot = part("snapshot", snap)
    taken: list[Any] = []
    cap.census = part("census", lambda: _census(census_top_n, taken))
    found = part("killer", lambda: _killer(taken)) if killer else None
    taken.clear()
    if found is not None and isinstance(cap.census, dict):
        cap.census["killer"] = found
    tl = view.timeline
    if tl is not None and timeline_rows > 0:
        part("timeline", lambda: _copy_timeline(cap, tl, timeline_rows))
    if tl is not None:
        cap.epochs = part("epochs", lambda: [e.to_dict() for e in tl.epochs]) or []
    cap.findings = part("findings", lambda: [f.to_dict() for f in view.findings]) or []
    cap.done = time.monotonic()
    return cap
