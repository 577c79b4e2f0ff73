"""Bounds a holder carries itself, read from the live container, and a weak way back to it.

A ``collections.deque(maxlen=N)`` drops its oldest item once full; a ``functools.lru_cache``
with a ``maxsize`` evicts its least recently used entry. Memory such a holder keeps grows to a
bound and stops, whatever the run does: the holder walk (:mod:`.holders`) reads the bound off the
container it names (:func:`bound_of`) and keeps a weak way back to it (:func:`measurer`), so that
a later check can tell whether it still grows.

Example::

    >>> import collections
    >>> d = collections.deque(range(3), maxlen=5)
    >>> bound_of(d)
    Bound(kind='deque', capacity=5, length=3)
    >>> m = measurer(d)
    >>> d.extend(range(10)); m()
    HolderSize(length=5, bound=Bound(kind='deque', capacity=5, length=5))
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable
from typing import Any

from memwatch.analysis.culprits.holders.untracked import is_lru_cache
from memwatch.analysis.evidence import Bound, HolderSize

__all__ = ["bound_of", "measurer"]


def bound_of(obj: Any) -> Bound | None:
    """The bound ``obj`` carries itself, as it stands now; None when it has none."""
    try:
        if isinstance(obj, collections.deque) and obj.maxlen is not None:
            return Bound("deque", int(obj.maxlen), len(obj))
        if is_lru_cache(obj):
            info = obj.cache_info()
            if info.maxsize is not None:
                return Bound("lru_cache", int(info.maxsize), int(info.currsize))
    except Exception:  # noqa: BLE001 - a container that misbehaves has no bound we can read
        return None
    return None


def _size(obj: Any) -> HolderSize | None:
    if is_lru_cache(obj):
        try:
            return HolderSize(int(obj.cache_info().currsize), bound_of(obj))
        except Exception:  # noqa: BLE001
            return None
    try:
        return HolderSize(len(obj), bound_of(obj))
    except TypeError:
        return None


def measurer(obj: Any, owner: Any = None, attr: str | None = None
             ) -> Callable[[], HolderSize | None] | None:
    """A function that measures ``obj`` again later without keeping it alive: through a weak
    reference to it, or (a ``list`` or ``dict``, which take none) to ``owner``, whose attribute
    ``attr`` holds it. None when neither is possible (a local of a frame, a closure)."""
    try:
        ref: weakref.ref[Any] = weakref.ref(obj)
    except TypeError:
        if owner is None or attr is None:
            return None
        try:
            owner_ref: weakref.ref[Any] = weakref.ref(owner)
        except TypeError:
            return None

        def through_owner() -> HolderSize | None:
            o = owner_ref()
            held = getattr(o, attr, None) if o is not None else None
            return None if held is None else _size(held)

        return through_owner

    def direct() -> HolderSize | None:
        o = ref()
        return None if o is None else _size(o)

    return direct
