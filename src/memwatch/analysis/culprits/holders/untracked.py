"""What the collector cannot see refer to an object: numpy arrays.

``gc.get_referrers`` lists only the objects the collector tracks, and a numpy array is not one of
them: an array made by ``tensor.numpy()`` keeps its tensor alive through its ``base``, and a
view keeps the array it was taken from, yet neither shows up as a referrer. A holder walk that
reaches a tensor (or an array) nobody tracked refers to asks :class:`ArrayBases`, which lists,
once per attribution and only when a walk needs it, the arrays that tracked objects hold and
whose ``base`` is something: ``transformers``' ``compute_metrics`` receives ``p.predictions``
made this way, and a module list that keeps them keeps the tensors.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any

from memwatch.analysis.culprits.census.large import UntrackedScan

__all__ = ["ArrayBases", "is_array", "is_lru_cache"]

def is_array(obj: Any) -> bool:
    """A numpy array (never imports numpy)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.ndarray)


def is_lru_cache(obj: Any) -> bool:
    """A ``functools.lru_cache`` / ``functools.cache`` wrapper (it holds its results)."""
    return type(obj).__name__ == "_lru_cache_wrapper"


class ArrayBases:
    """The numpy arrays tracked objects hold, by the id of their ``base``: built on first use
    (a pass over the referents of every tracked object, 150-200 ms on a framework's heap of
    380,000 objects, CPU; only when a walk reached an object that nothing tracked refers to),
    within ``budget_s`` CPU seconds of the calling thread (cut short: what was found so far)."""

    def __init__(self, budget_s: float = 1.0) -> None:
        self.budget_s = budget_s
        # weak references: the index must not be what a walk finds holding an array
        self._by_base: dict[int, list[weakref.ref[Any]]] | None = None
        self.truncated = False

    def arrays_on(self, obj: Any) -> list[Any]:
        """The arrays whose ``base`` is ``obj`` (tensor or array)."""
        if self._by_base is None:
            self._by_base = self._build()
        found = (r() for r in self._by_base.get(id(obj), ()))
        return [a for a in found if a is not None and a.base is obj]

    def _build(self) -> dict[int, list[weakref.ref[Any]]]:
        np = sys.modules.get("numpy")
        out: dict[int, list[weakref.ref[Any]]] = {}
        if np is None:
            return out
        wanted = {np.ndarray, getattr(np, "memmap", np.ndarray)}
        scan = UntrackedScan(wanted, time.thread_time() + self.budget_s)
        for a in scan:
            base = a.base
            if base is not None:
                lst = out.setdefault(id(base), [])
                if len(lst) < 64 and not any(x() is a for x in lst):
                    lst.append(weakref.ref(a))
        self.truncated = scan.truncated
        return out

    def close(self) -> None:
        if self._by_base is not None:
            self._by_base.clear()
        self._by_base = None
