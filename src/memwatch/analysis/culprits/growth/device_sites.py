"""Where the leaking device tensors were allocated: the census names who *holds* a growing group
of device tensors; with the allocator's history recorded (``MemWatch(record_history=True)``) the
allocator snapshot's blocks carry the frames of the allocation that made them, so the tensors'
``data_ptr()`` addresses join the holder to the *allocation site*.

Pure functions of a snapshot (``torch.cuda.memory._snapshot()``'s shape: ``segments`` ->
``blocks`` with ``address``, ``size``, ``state`` and, when recorded, ``frames``) and addresses.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Iterable
from typing import Any

from memwatch.analysis.culprits.census.ownership import is_user_file

__all__ = ["AllocSite", "join"]



@dataclasses.dataclass
class AllocSite:
    """An allocation site of some of the leaking tensors: the innermost frame of user code."""

    where: str  # "train.py:42 in forward"
    tensors: int
    bytes: int
    frames: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _frame(f: dict[str, Any]) -> str:
    return f"{os.path.basename(str(f.get('filename', '?')))}:{f.get('line', '?')} in " \
           f"{f.get('name', '?')}"


def _user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    for f in frames:
        name = str(f.get("filename", ""))
        if name and is_user_file(name):
            return f
    return frames[0] if frames else None


def join(snapshot: Any, addresses: Iterable[int], top: int = 3) -> list[AllocSite]:
    """Allocation sites of the live blocks that start at ``addresses``, most tensors first.
    Empty when the snapshot has no frames (history not recorded) or no block matches."""
    want = set(int(a) for a in addresses)
    if not want or not isinstance(snapshot, dict):
        return []
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    stacks: dict[str, list[str]] = {}
    for seg in snapshot.get("segments", []) or []:
        for b in seg.get("blocks", []) or []:
            addr = b.get("address")
            if addr not in want or not str(b.get("state", "")).startswith("active"):
                continue
            frames = b.get("frames") or []
            uf = _user_frame(frames)
            if uf is None:
                continue
            key = _frame(uf)
            counts[key] += 1
            sizes[key] += int(b.get("size", 0))
            stacks.setdefault(key, [_frame(f) for f in frames[:6]])
    return [AllocSite(k, n, sizes[k], stacks[k]) for k, n in counts.most_common(top)]
