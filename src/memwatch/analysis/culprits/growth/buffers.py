"""Buffers by identity: what a container's new elements add in array and tensor memory.

A view (a numpy slice, ``tensor[..., :k]``, ``tensor.numpy()``) keeps the memory of what it was
taken from, and a thousand views of one base keep that base once. Weighing each sampled element
as if it owned its base and scaling the sample to every new element counts the base once per
element: a list of 1,000 numpy views over a few shared 8 MiB arrays weighed gigabytes for
the 30 MiB those arrays hold. Here a buffer is known by its identity — the storage for a tensor
(its device and address), the array that owns the memory for numpy (``base`` followed down) —
and counted once, and not at all when something other than the views keeps it alive (a base
the program holds anyway is not what the views add).

:func:`buffer_of` names one object's buffer; :func:`population` reads every new element's (up
to :data:`MAX_ELEMENTS`, one level into tuples, lists and dicts: a view kept alone or with a
few fields), at C-attribute speed; :func:`held_elsewhere` asks the collector, once for all the
shared bases, which of them something else keeps.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable
from typing import Any

from memwatch.analysis.culprits.census.graphs import own_storage
from memwatch.analysis.culprits.census.ownership import is_own_file

__all__ = ["MAX_ELEMENTS", "Buffer", "BufferKey", "buffer_of", "held_elsewhere", "population"]

#: A buffer's identity: ("t", device, storage address) or ("n", id of the owning array).
BufferKey = tuple[Any, ...]
#: (identity, bytes, the object that owns it: the owning array or the base tensor).
Buffer = tuple[BufferKey, int, Any]

#: New elements whose buffers are read one by one (more: an even sample of this many, scaled).
MAX_ELEMENTS = 20_000
#: Items of a tuple, list or dict element looked into (a record of a few fields).
_FIELDS = 16


def buffer_of(obj: Any) -> Buffer | None:
    """The buffer a numpy array or a tensor keeps, or None (not one; a meta or sparse tensor).

    Example::

        >>> import numpy as np
        >>> base = np.zeros(1000)
        >>> buffer_of(base[:10])[0] == buffer_of(base[500:])[0], buffer_of(base[:10])[1]
        (True, 8000)
    """
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        root = obj
        for _ in range(64):  # a view of a view ...: down to the array that owns the memory
            base = root.base
            if base is None or not isinstance(base, np.ndarray):
                break
            root = base
        base = root.base
        if base is not None and _is_tensor(base):
            return _storage(base)  # ``tensor.numpy()``: the tensor's storage
        return ("n", id(root)), int(root.nbytes), root
    if _is_tensor(obj):
        return _storage(obj)
    return None


def population(elements: Iterable[Any], looked: set[int] | None = None
               ) -> tuple[dict[BufferKey, list[Any]], int]:
    """Every buffer the elements keep directly or one level into a tuple, list or dict:
    ``{key: [bytes, owner, elements that reach it]}``, and the number of elements read. The ids
    of the tuples, lists and dicts looked into are added to ``looked`` (they are the elements'
    own: never "something else" that keeps a buffer)."""
    out: dict[BufferKey, list[Any]] = {}
    n = 0
    for x in elements:
        n += 1
        reached: set[BufferKey] = set()
        for y in _fields(x):
            if looked is not None and type(y) in (tuple, list, dict):
                looked.add(id(y))
            b = buffer_of(y)
            if b is None or b[0] in reached:
                continue
            reached.add(b[0])
            entry = out.get(b[0])
            if entry is None:
                out[b[0]] = [b[1], b[2], 1]
            else:
                entry[2] += 1
    return out, n


def held_elsewhere(owners: dict[BufferKey, Any], ignore: set[int]) -> set[BufferKey]:
    """The buffers whose owner something other than the views keeps alive: a referrer the
    collector tracks (numpy views are not tracked, and a tensor view keeps its base from C++),
    other than memwatch's own frames and the objects in ``ignore``. One pass over the heap
    for all of them."""
    if not owners:
        return set()
    by_id = {id(o): k for k, o in owners.items()}
    objs = list(owners.values())
    found: set[BufferKey] = set()
    refs = gc.get_referrers(*objs)
    try:
        for r in refs:
            if id(r) in ignore or r is objs or r is owners:
                continue
            if isinstance(r, types.FrameType) and _own_frame(r):
                continue
            for x in gc.get_referents(r):
                k = by_id.get(id(x))
                if k is not None:
                    found.add(k)
    finally:
        refs.clear()
        objs.clear()
    return found


def _fields(x: Any) -> list[Any]:
    if type(x) in (tuple, list):
        return [x, *x[:_FIELDS]]
    if type(x) is dict:
        return [x, *list(x.values())[:_FIELDS]]
    return [x]


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _storage(t: Any) -> Buffer | None:
    try:
        if t.is_meta or t.layout != sys.modules["torch"].strided:
            return None
        st = own_storage(t)  # None for a wrapper subclass (DTensor): its local tensor counts
        if st is None:
            return None
        base = t._base if t._is_view() else t
        return ("t", str(t.device), int(st.data_ptr())), int(st.nbytes()), \
            base if base is not None else t
    except Exception:  # noqa: BLE001 - exotic tensor subclasses
        return None


def _own_frame(f: types.FrameType) -> bool:
    return is_own_file(f.f_code.co_filename)
