"""Which containers a census counts, and which of them grew between two censuses.

The census records the length of every large container (lists, dicts, deques, sets) the
collector tracks, and of the large dicts it does not: CPython untracks dicts that hold only
strings, numbers or bytes, so :func:`untracked_dicts` finds them where user code keeps them
(module globals, attributes of instances of user-defined classes, locals of running user
functions). :func:`container_growth` diffs two such records; the weighing
(:mod:`..growth.weigh`) then measures what the grown ones hold in bytes.
"""

from __future__ import annotations

import collections
import functools
import gc
import sys
import types
from typing import Any

from memwatch.analysis.culprits.census.ownership import is_user_file, is_user_module
from memwatch.analysis.evidence import ContainerGrowth

__all__ = ["CACHE_TYPE", "CONTAINER_MIN_LEN", "CONTAINER_TYPES", "SEQUENCE_MIN_LEN",
           "cache_entries", "cache_size", "container_growth", "untracked_dicts",
           "user_namespaces"]

#: Containers shorter than this are not recorded (the census stays small).
CONTAINER_MIN_LEN = 16
#: Lists and deques from this length: a framework's list of prepared models or optimizers
#: grows by one element a trial, each element megabytes (accelerate#84). A process with torch,
#: Lightning and transformers imported holds about 2,400 lists of 4 to 15 elements against
#: 20,000 dicts (which keep the higher bound).
SEQUENCE_MIN_LEN = 4
CONTAINER_TYPES: dict[type, str] = {
    list: "list",
    dict: "dict",
    set: "set",
    collections.deque: "deque",
    collections.OrderedDict: "dict",
    collections.defaultdict: "dict",
    collections.Counter: "dict",
}


#: ``functools.lru_cache``'s and ``functools.cache``'s wrapper: a container of its results,
#: recorded by its entries (``cache_info().currsize``) as kind ``"cache"``.
CACHE_TYPE: type = type(functools.lru_cache(maxsize=None)(len))


def cache_size(wrapper: Any) -> int | None:
    """The entries a functools cache holds now (None: not a cache that says)."""
    try:
        return int(wrapper.cache_info().currsize)
    except Exception:  # noqa: BLE001 - a look-alike, or a cache that refuses
        return None


def cache_entries(wrapper: Any) -> list[tuple[Any, Any]]:
    """A functools cache's ``(key, result)`` entries, the oldest first (the most recently used
    last, in a bounded cache); ``[]`` where they cannot be told apart. The wrapper keeps them
    in C: they are read from what it lists to the collector (a bounded cache: its type, then
    each entry's key, result and link type; an unbounded one: the dict of its entries)."""
    n = cache_size(wrapper)
    if not n:
        return []
    try:
        unbounded = wrapper.cache_parameters()["maxsize"] is None
        own = getattr(wrapper, "__dict__", None)
    except Exception:  # noqa: BLE001
        return []
    refs = gc.get_referents(wrapper)
    try:
        if unbounded:
            for r in refs:
                if type(r) is dict and r is not own and len(r) == n:
                    return list(r.items())
            return []
        out: list[tuple[Any, Any]] = []
        i = 1
        while i + 2 < len(refs) and len(out) < n and isinstance(refs[i + 2], type):
            out.append((refs[i], refs[i + 1]))
            i += 3
        return out if len(out) == n else []
    finally:
        refs.clear()


def untracked_dicts(user_instances: list[Any]) -> dict[int, tuple[int, str]]:
    """Large dicts the collector does not track, held by user modules' globals or by attributes
    of user-class instances: ``id -> (len, "dict")``."""
    out: dict[int, tuple[int, str]] = {}
    for ns in user_namespaces(user_instances):
        if not isinstance(ns, dict):
            continue
        for v in list(ns.values()):
            if type(v) in CONTAINER_TYPES and len(v) >= CONTAINER_MIN_LEN and \
                    isinstance(v, dict) and not _is_tracked(v):
                out[id(v)] = (len(v), "dict")
    return out


def user_namespaces(user_instances: list[Any]) -> list[Any]:
    """Where user code keeps untracked dicts: user modules' globals, user instances' attributes,
    and the locals of user functions still running (``main()``'s ``store = {}``: a dict of
    arrays or strings is not tracked by the collector, and nothing else refers to it)."""
    spaces: list[Any] = [getattr(m, "__dict__", None) for m in list(sys.modules.values())
                         if m is not None and is_user_module(m)]
    for o in user_instances:
        try:
            spaces.append(object.__getattribute__(o, "__dict__"))
        except Exception:  # noqa: BLE001 - slots, proxies
            continue
    spaces.extend(_user_frame_locals())
    return spaces


def _user_frame_locals() -> list[dict[str, Any]]:
    """``f_locals`` of every running frame of user code, on every thread."""
    out: list[dict[str, Any]] = []
    for frame in sys._current_frames().values():
        f: types.FrameType | None = frame
        while f is not None:
            if is_user_file(f.f_code.co_filename):
                try:
                    out.append(f.f_locals)
                except Exception:  # noqa: BLE001 - a frame being torn down
                    pass
            f = f.f_back
    return out


def _is_tracked(o: Any) -> bool:
    import gc

    return gc.is_tracked(o)


def container_growth(prev: dict[int, tuple[int, str]],
                     cur: dict[int, tuple[int, str]]) -> list[ContainerGrowth]:
    """Containers longer now than at the previous census (not weighed yet), longest growth
    first."""
    out = []
    for cid, (n, kind) in cur.items():
        p = prev.get(cid)
        if p is not None and p[1] != kind:
            p = None  # the id was reused by another container
        dn = n - (p[0] if p is not None else 0)
        if dn > 0:
            out.append(ContainerGrowth(cid, kind, n, dn, p is None))
    out.sort(key=lambda g: g.len_delta, reverse=True)
    return out
