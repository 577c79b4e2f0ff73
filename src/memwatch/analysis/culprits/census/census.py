"""Tensor census: *what* is growing.

A census walks the garbage collector's objects once, groups live tensors by (device, dtype, shape,
requires_grad, grad_fn type) and deduplicates bytes by storage (a view's base storage is counted
with the view: whoever holds the view holds the base). It also counts the autograd nodes behind
tensors with history (:mod:`.graphs`) and records the length of large containers
(:mod:`.containers`), so that growth of Python objects and of graphs can be measured in bytes
(:mod:`..growth.weigh`). Diffing two censuses taken at checks names what grew; a bounded walk up
``gc.get_referrers`` (:mod:`..holders.holders`) names who holds it.

Costs are measured and returned with every result; nothing here ever runs per step.
"""

from __future__ import annotations

import collections
import gc
import itertools
import sys
import time
import weakref
from typing import Any

from memwatch.analysis.culprits.census import graphs, ownership
from memwatch.analysis.culprits.census.containers import (
    CACHE_TYPE,
    CONTAINER_MIN_LEN,
    CONTAINER_TYPES,
    SEQUENCE_MIN_LEN,
    cache_size,
    untracked_dicts,
)
from memwatch.analysis.evidence import Census, Group, GroupGrowth, GroupKey

__all__ = ["Census", "Group", "GroupGrowth", "GroupKey", "TooManyObjects", "diff", "net_growth",
           "take_census", "tensor_census", "type_growth"]

_MAX_IDS_PER_GROUP = 4096
#: Instances of user classes whose attributes are looked at for untracked dicts: the holders
#: of a run (trainer, metrics, model wrappers) are few; a Dataset of a million records of a
#: user class would make every census walk each record's attributes.
_MAX_USER_INSTANCES = 20_000


_SEQUENCES = frozenset({"list", "deque"})


def _torch() -> Any | None:
    return sys.modules.get("torch")


def _type_name(tp: type) -> str | None:
    return None if ownership.is_own_type(tp) else tp.__qualname__


#: What each type is to the census, kept from one census to the next while the type lives (a
#: framework's heap has about 1,000 types, and whether one is the user's or memwatch's is a
#: question about its module's file: 30 ms of every census otherwise).
_TYPE_INFO: weakref.WeakKeyDictionary[type, tuple[str | None, str | None, bool, bool]] = \
    weakref.WeakKeyDictionary()


def _type_info(tp: type, tensor_type: Any) -> tuple[str | None, str | None, bool, bool]:
    try:
        return _TYPE_INFO[tp]
    except (KeyError, TypeError):
        pass
    info = _type_info_of(tp, tensor_type)
    if tensor_type is not None:  # (before torch is imported, no type is a tensor yet)
        try:
            _TYPE_INFO[tp] = info
        except TypeError:  # a type that cannot be weakly referenced: worked out every time
            pass
    return info


def _type_info_of(tp: type, tensor_type: Any) -> tuple[str | None, str | None, bool, bool]:
    """(name for the type counts or None for memwatch's own, container kind, user class,
    tensor). type() and issubclass, not isinstance: isinstance consults ``__class__``, which
    some lazy objects turn into a deprecation warning or an import."""
    kind = CONTAINER_TYPES.get(tp)
    is_tensor = tensor_type is not None and issubclass(tp, tensor_type)
    return (_type_name(tp), kind, kind is None and not is_tensor and ownership.is_user_type(tp),
            is_tensor)


class TooManyObjects(Exception):
    """The heap holds more objects than the census was allowed to walk (``objects``)."""

    def __init__(self, objects: int) -> None:
        super().__init__(f"{objects} objects")
        self.objects = objects


def take_census(collect: bool = False, count_types: bool = True,
                max_objects: int | None = None) -> Census:
    """Walk live objects once. ``collect=True`` runs ``gc.collect()`` first (only garbage that
    cycles keep would otherwise be counted; what survives a collection is really held).
    Past ``max_objects`` live objects, nothing is walked: :class:`TooManyObjects` (after the
    listing, which is what counting them costs anyway).

    ``count_types=False`` leaves ``Census.types`` empty: counting allocates an int per object
    (counts past 256 are not cached), which tracemalloc, when it runs, traces one by one, making
    the census several times slower; its allocation-site diff replaces the type counts then.
    """
    t0 = time.perf_counter()
    if collect:
        gc.collect()
    torch = _torch()
    tensor_type = torch.Tensor if torch is not None else None
    groups: dict[GroupKey, Group] = {}
    tensor_bytes: dict[str, int] = collections.Counter()
    # storage -> (group that counted its bytes, counted by a view?, its bytes)
    claims: dict[tuple[str, int], tuple[Group, bool, int]] = {}
    type_counts: collections.Counter[str] = collections.Counter()
    containers: dict[int, tuple[int, str]] = {}
    own: list[Any] = []  # memwatch's objects: their containers are left out
    user: list[Any] = []  # instances of user classes: their untracked dicts are looked at
    graph = graphs.GraphWalk()
    n_tensors = 0
    # What a type is to the census, worked out once per type (issubclass allocates a little
    # each call, traced one by one when tracemalloc runs).
    # memwatch's own objects (samples, findings, censuses kept for the next diff) grow with the
    # run by design: they are never a culprit, so they are not counted.
    tinfo: dict[type, tuple[str | None, str | None, bool, bool]] = {}
    objs = gc.get_objects()
    n_objects = len(objs)
    if max_objects is not None and n_objects > max_objects:
        del objs
        raise TooManyObjects(n_objects)
    # Types first, at C speed, a slice of the listing at a time: most objects (functions,
    # tuples, cells, descriptors) only add to the type counts, and only containers, tensors,
    # user instances and memwatch's own objects are looked at one by one (about a sixth of a
    # framework's heap; the census takes half the time it took walking every object).
    picked, long = _pick(objs, tensor_type, tinfo, type_counts, count_types)
    del objs
    for o in long:  # containers at least CONTAINER_MIN_LEN long (a sequence: SEQUENCE_MIN_LEN)
        containers[id(o)] = (len(o), tinfo[type(o)][1])  # type: ignore[assignment]
    del long
    for o in picked:
        name, _, is_user, is_tensor = tinfo[type(o)]
        if name is None:
            own.append(o)
        if type(o) is CACHE_TYPE:  # a functools cache: a container of its results
            # Every size, empty ones too: a cache filled since the previous census is the same
            # cache, which the first call after a restart empties no less than a list.
            n = cache_size(o)
            if n is not None and not ownership.is_own_object(o):
                containers[id(o)] = (n, "cache")
            continue
        if is_user and len(user) < _MAX_USER_INSTANCES:
            user.append(o)
        if not is_tensor:
            continue
        try:
            dev = str(o.device)
            gfn = o.grad_fn
            key: GroupKey = (
                dev,
                str(o.dtype),
                tuple(int(s) for s in o.shape),
                bool(o.requires_grad),
                type(gfn).__name__ if gfn is not None else "",
            )
            st = None
            if o.layout == torch.strided and not o.is_meta:  # type: ignore[union-attr]
                st = graphs.own_storage(o)  # None for a DTensor: its local tensor is counted
            view = st is not None and o._is_view()
        except Exception:  # noqa: BLE001 - exotic tensor subclasses: skip, never fail
            continue
        n_tensors += 1
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(*key)
        g.count += 1
        g.views += view
        if len(g.ids) < _MAX_IDS_PER_GROUP:
            g.ids.append(id(o))
        if st is not None:
            _claim(claims, g, dev, st, view, tensor_bytes)
        if gfn is not None:
            nodes = graph.add_node(gfn)
            if nodes:
                g.graph_nodes += nodes
                g.graph_bytes += graph.last_bytes(nodes)
                g.graph_saved += graph.last_saved
    del picked
    storages = _big_storages(claims)
    claims.clear()
    _drop_own(containers, own)
    containers.update(untracked_dicts(user))
    own.clear()
    user.clear()
    n_nodes, truncated = graph.nodes, graph.truncated
    graph.close()
    return Census(groups, n_tensors, dict(tensor_bytes), n_objects, type_counts,
                  (time.perf_counter() - t0) * 1000.0, time.time(), containers, n_nodes,
                  truncated, storages=storages)


#: Objects of the heap's listing typed at a time. Each object's type is read once, into a list
#: this long (64 KiB) that the counting and the choice then both go through while it is in the
#: cache: a framework's heap is 350,000 objects scattered over hundreds of MiB, and reading
#: their headers is most of a census (two passes over them, one to count and one to choose,
#: took 145 ms where this takes 104, quiet; in a training process, whose data-loading workers
#: share the caches, the second pass cost more). Never a heap-sized list of types: freed, its
#: megabytes were what the run's next allocations reused, and a leak's RSS stood still for
#: the first 12-16 steps after a census (0f2327c).
_CHUNK = 8192


def _pick(objs: list[Any], tensor_type: Any,
          tinfo: dict[type, tuple[str | None, str | None, bool, bool]],
          type_counts: collections.Counter[str],
          count_types: bool) -> tuple[list[Any], list[Any]]:
    """The objects of ``objs`` the census looks at one by one (tensors, user instances,
    memwatch's own) and the containers long enough to record (a sixth of a framework's heap is
    containers, most of them short: their lengths are compared at C speed, never one by one in
    Python), filling ``tinfo`` for every type seen and ``type_counts`` by type name. Counting
    allocates ints (counts past 256 are not cached), which tracemalloc would trace one by one:
    without ``count_types``, a set of the types instead."""
    # the types seen so far: counted, or (without count_types) a set
    known: collections.Counter[type] | set[type] = \
        collections.Counter() if count_types else set()
    wanted: set[type] = set()  # looked at one by one
    # containers, by the length from which they are recorded
    sized: tuple[tuple[int, set[type]], ...] = ((CONTAINER_MIN_LEN, set()),
                                                (SEQUENCE_MIN_LEN, set()))
    picked: list[Any] = []
    long: list[Any] = []
    for i in range(0, len(objs), _CHUNK):
        chunk = objs[i:i + _CHUNK]
        types = list(map(type, chunk))
        known.update(types)
        if len(known) > len(tinfo):  # types not met before in this census
            for tp in known:
                if tp not in tinfo:
                    info = tinfo[tp] = _type_info(tp, tensor_type)
                    name, kind, is_user, is_tensor = info
                    if kind is not None:  # (a container type is never memwatch's own)
                        sized[kind in _SEQUENCES][1].add(tp)
                    elif name is None or is_user or is_tensor or tp is CACHE_TYPE:
                        wanted.add(tp)
        picked.extend(itertools.compress(chunk, map(wanted.__contains__, types)))
        for min_len, of_kind in sized:
            if of_kind:
                these = list(itertools.compress(chunk, map(of_kind.__contains__, types)))
                long.extend(itertools.compress(these, map(min_len.__le__, map(len, these))))
                del these
        del chunk, types
    if isinstance(known, collections.Counter):
        for tp, n in known.items():
            name = tinfo[tp][0]
            if name is not None:
                type_counts[name] += n
    return picked, long


def _claim(claims: dict[tuple[str, int], tuple[Group, bool, int]], g: Group, dev: str, st: Any,
           view: bool, tensor_bytes: dict[str, int]) -> None:
    """Count a storage's bytes once, with a view of it rather than its base: the base of a kept
    view is often reachable only through the view, so whoever holds the view holds the bytes."""
    ptr = int(st.data_ptr())
    sk = (dev, ptr)
    prev = claims.get(sk)
    if prev is None or ptr == 0:
        nbytes = int(st.nbytes())
        claims[sk] = (g, view, nbytes)
        g.bytes += nbytes
        tensor_bytes[dev] += nbytes
    elif view and not prev[1]:
        nbytes = prev[2]
        prev[0].bytes -= nbytes
        g.bytes += nbytes
        claims[sk] = (g, True, nbytes)


#: Storages from this size are remembered by identity from one census to the next: a group of
#: new views that claims a storage an earlier census already counted adds nothing.
BIG_STORAGE = 1 << 20


def _big_storages(claims: dict[tuple[str, int], tuple[Group, bool, int]]
                  ) -> dict[tuple[str, int], tuple[GroupKey, int]]:
    """The large storages of a census: identity -> (the group that counts it, its bytes)."""
    return {sk: (g.key, nb) for sk, (g, _, nb) in claims.items()
            if sk[1] and nb >= BIG_STORAGE}


def _moved(prev: Census, cur: Census) -> collections.Counter[GroupKey]:
    """Bytes of large storages each group counts now that another group counted at ``prev``:
    views taken since of a storage that was there already (they add nothing)."""
    out: collections.Counter[GroupKey] = collections.Counter()
    for sk, (gk, nb) in cur.storages.items():
        was = prev.storages.get(sk)
        if was is not None and was[0] != gk and was[1] == nb:
            out[gk] += nb
    return out


def _drop_own(containers: dict[int, tuple[int, str]], own: list[Any]) -> None:
    """Leave out the containers memwatch's own objects and modules hold (three levels down: a
    census's dict of groups, a store's dict of lists, a module's cache of types, including
    the dict inside a ``weakref.WeakKeyDictionary``): they grow with the run by design.
    Only containers and the stdlib's weak containers are followed (memwatch's own objects are
    all in ``own`` already): never into an object of the user's that memwatch holds (the
    trainer an adapter keeps)."""
    frontier: list[Any] = []
    for name, mod in list(sys.modules.items()):  # memwatch's module-level caches
        if ownership.is_own_module_name(name):
            d = getattr(mod, "__dict__", None)
            if isinstance(d, dict):
                frontier.extend(v for v in d.values() if type(v) in _FOLLOWED)
    for o in own:
        frontier.extend(v for v in _attributes(o) if type(v) in _FOLLOWED)
    for _ in range(3):
        nxt: list[Any] = []
        for c in frontier:
            containers.pop(id(c), None)
            try:
                if type(c) in CONTAINER_TYPES:
                    vals = c.values() if isinstance(c, dict) else c
                else:  # a weak container: the container inside it
                    vals = _attributes(c)
                nxt.extend(v for v in vals if type(v) in _FOLLOWED)
            except Exception:  # noqa: BLE001 - mutated under us
                continue
        frontier = nxt
    for c in frontier:
        containers.pop(id(c), None)


#: What the walk over memwatch's own state goes into: containers and weak containers.
_FOLLOWED = frozenset({*CONTAINER_TYPES, weakref.WeakKeyDictionary, weakref.WeakValueDictionary,
                       weakref.WeakSet})


def _attributes(o: Any) -> list[Any]:
    """An object's attribute values: its ``__dict__``'s and its slots'."""
    d = getattr(o, "__dict__", None)
    vals: list[Any] = list(d.values()) if isinstance(d, dict) else []
    for slot in getattr(type(o), "__slots__", ()) or ():
        v = getattr(o, slot, None)
        if v is not None:
            vals.append(v)
    return vals


def tensor_census(top_n: int = 20) -> dict[str, Any]:
    """A JSON-able census of live tensors: the largest groups first (used by OOM bundles)."""
    c = take_census()
    return c.to_dict(top_n)


def diff(prev: Census, cur: Census, device_prefix: str | None = None) -> list[GroupGrowth]:
    """Groups that grew between two censuses, largest growth first."""
    out = []
    moved = _moved(prev, cur)
    for key, g in cur.groups.items():
        if device_prefix is not None and not key[0].startswith(device_prefix):
            continue
        p = prev.groups.get(key)
        dc = g.count - (p.count if p else 0)
        # (views of a storage another group counted at the previous census add nothing)
        db = g.bytes - (p.bytes if p else 0) - moved.get(key, 0)
        dn = g.graph_nodes - (p.graph_nodes if p else 0)
        dgb = g.graph_bytes - (p.graph_bytes if p else 0)
        dgs = g.graph_saved - (p.graph_saved if p else 0)
        if dc <= 0 and db <= 0 and dn <= 0:
            continue
        old = set(p.ids) if p else set()
        new_ids = [i for i in g.ids if i not in old]
        out.append(GroupGrowth(g, dc, db, new_ids, dn, dgb, dgs))
    out.sort(key=lambda x: (x.effective_bytes, x.count_delta), reverse=True)
    return out


def net_growth(prev: Census, cur: Census, device_prefix: str | None = None) -> int:
    """Bytes the live tensors of ``device_prefix`` added in all between two censuses (storages
    and autograd graphs, every group: those that lost count against those that gained).

    :func:`diff` lists only the groups that gained, each by its own shape: a cache at its bound
    that replaces entries of one shape with entries of another (sequence lengths, crops) shows
    gains in some groups and as much lost in others, and the gains alone are no growth."""
    def total(c: Census) -> int:
        return sum(g.bytes + g.graph_bytes for k, g in c.groups.items()
                   if device_prefix is None or k[0].startswith(device_prefix))
    return total(cur) - total(prev)


def type_growth(prev: Census, cur: Census, top: int = 5) -> list[tuple[str, int]]:
    deltas = [(k, v - prev.types.get(k, 0)) for k, v in cur.types.items()]
    return sorted([d for d in deltas if d[1] > 0], key=lambda d: d[1], reverse=True)[:top]
