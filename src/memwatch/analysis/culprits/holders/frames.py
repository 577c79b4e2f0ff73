"""Live stacks: what ``gc.get_referrers`` cannot see.

The collector does not traverse frames that are executing, so an object held only by a local
variable of a function still running (the training loop that called ``end_epoch()``, a
generator) has no referrer the collector reports. These two look at every thread's stack
directly; memwatch's own frames are skipped (they hold what they walk).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from memwatch.analysis.culprits.census.ownership import is_own_file, is_user_file
from memwatch.analysis.culprits.holders.names import local_label

__all__ = ["frame_local_label", "live_frame_local"]


def _user_frames() -> list[types.FrameType]:
    out: list[types.FrameType] = []
    for frame in sys._current_frames().values():
        f: types.FrameType | None = frame
        while f is not None:
            if not is_own_file(f.f_code.co_filename):
                out.append(f)
            f = f.f_back
    return out


def frame_local_label(d: dict[Any, Any], key: Any) -> tuple[str, bool] | None:
    """``d`` is the ``f_locals`` snapshot of a live frame: name that frame's variable ``key``,
    and say whether the frame runs the user's code."""
    frames = _user_frames()
    try:
        for f in frames:
            if f.f_locals is d:
                return local_label(f, key), is_user_file(f.f_code.co_filename)
        return None
    finally:
        frames.clear()  # frames hold their locals: drop them before the walk goes on


def live_frame_local(obj: Any) -> str | None:
    """The local variable of a function still running on some thread's stack that is ``obj``:
    of the user's code first (``main() (train.py:40): local trainer``, not the ``self`` of the
    framework's loop that the user's ``trainer.train()`` is running)."""
    frames = _user_frames()
    frames.sort(key=lambda f: not is_user_file(f.f_code.co_filename))  # (stable)
    try:
        for f in frames:
            for name, v in f.f_locals.items():
                if v is obj:
                    return local_label(f, name)
        return None
    finally:
        frames.clear()
