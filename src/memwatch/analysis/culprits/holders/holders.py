"""Holder naming: *who* keeps a growing object alive.

For one object of a growing group, a bounded walk up the reference graph names the holder: a
module global (``train.history``), an attribute (``model.fc._forward_hooks``), a closure cell, a
local of a running function, or a frame kept alive by a stored traceback. Bounded in depth and
time; memwatch's own frames and bookkeeping are never reported.

The pieces: :mod:`.referrers` (one hop: who refers to an object and how that reads),
:mod:`.frames` (locals of running functions, which the collector cannot see), :mod:`.names`
(how a path reads); here, the walk that strings hops into a holder.
"""

from __future__ import annotations

import gc
import sys
import time
import types
from collections.abc import Mapping
from typing import Any

from memwatch.analysis.culprits.census.containers import CONTAINER_TYPES
from memwatch.analysis.culprits.growth.weigh import element_name
from memwatch.analysis.culprits.holders.bounds import bound_of, measurer
from memwatch.analysis.culprits.holders.frames import live_frame_local
from memwatch.analysis.culprits.holders.names import elements_of, is_index, short_name
from memwatch.analysis.culprits.holders.referrers import HOOK_DICTS, ReferrerGraph, is_root_module
from memwatch.analysis.culprits.holders.untracked import ArrayBases, is_lru_cache
from memwatch.analysis.evidence import Holder

__all__ = ["CUT", "NO_REFERRER", "OWN", "Holder", "find_holder", "holder_of", "objects_by_ids",
           "walk"]


def find_holder(obj_id: int, max_depth: int = 10, budget_s: float = 2.0) -> Holder | None:
    """Name what keeps the object with ``id(obj) == obj_id`` alive (bounded walk upwards)."""
    target = _object_by_id(obj_id)
    if target is None:
        return None
    return holder_of(target, max_depth, budget_s)


def holder_of(target: Any, max_depth: int = 10, budget_s: float = 2.0,
              ignore: tuple[int, ...] = (), owners: Mapping[int, int] | None = None,
              arrays: ArrayBases | None = None) -> Holder | None:
    """Name what keeps ``target`` alive (bounded walk upwards). The caller's own containers
    must not hold it (they would be reported) unless their ids are in ``ignore``; its frames
    are skipped when they run memwatch's code, so pass it from there or through
    :func:`find_holder`.

    ``owners``: ids of the containers that grew since the previous census (id -> elements
    added). The walk names the nearest of them it passes through — the owner that keeps
    gaining what leaks — and nothing below it: ``GRAD_DEBUG``, never ``GRAD_DEBUG[198]['grad']``,
    whichever element the walk started from, so the name is the same at every check.

    ``arrays``: where to look for numpy arrays over an object nothing tracked refers to (see
    :mod:`.untracked`); None: not looked for. None is returned, too, when the only route up is
    memwatch's own (see :func:`walk`)."""
    return walk(target, max_depth, budget_s, ignore, owners, arrays)[0]


#: Why a walk named no holder (:func:`walk`).
NO_REFERRER = "native"  # nothing in Python refers to it (native code, an autograd graph)
OWN = "own"  # only memwatch's own objects keep it
CUT = "cut"  # the walk ran out of its budget or its depth


def walk(target: Any, max_depth: int = 10, budget_s: float = 2.0,
         ignore: tuple[int, ...] = (), owners: Mapping[int, int] | None = None,
         arrays: ArrayBases | None = None) -> tuple[Holder | None, str]:
    """:func:`holder_of`, with why no holder was named: ``""`` when one was, :data:`OWN` when
    the object is memwatch's own (only memwatch's objects, modules or closures keep it: never
    a culprit), :data:`NO_REFERRER` when nothing in Python refers to it, :data:`CUT` when the
    walk stopped at its budget or depth before it found a name."""
    walker = _Walker(budget_s, owners or {}, arrays)
    walker.graph.ignore.update(ignore)
    try:
        h = walker.walk(target, max_depth)
        return h, "" if h is not None else walker.why
    finally:
        # Break the walker's reference cycles now, so no later walk meets its leftovers.
        walker.graph.close()


def objects_by_ids(ids: set[int]) -> dict[int, Any]:
    """Live objects whose ``id`` is in ``ids`` (one pass over the collector's objects)."""
    out: dict[int, Any] = {}
    if not ids:
        return out
    for o in gc.get_objects():
        if id(o) in ids:
            out[id(o)] = o
    return out


def _object_by_id(obj_id: int) -> Any | None:
    for o in gc.get_objects():
        if id(o) == obj_id:
            return o
    return None


class _Walker:
    """One walk from a target up to the root that holds it."""

    def __init__(self, budget_s: float, owners: Mapping[int, int],
                 arrays: ArrayBases | None = None) -> None:
        self.graph = ReferrerGraph(budget_s, arrays)
        #: Why the walk named nothing (see :func:`walk`).
        self.why = CUT
        #: The kinds of the hops whose labels are the segments (innermost first), and the
        #: index of the segment that names the container (None: the first segment).
        self.kinds: list[str] = []
        self.name_at: int | None = None
        self.cache_name: str | None = None
        self.elements: str | None = None
        self.owners = owners
        #: Elements the named owner gained since the previous census (None: no owner passed).
        self.owner_delta: int | None = None
        #: The walk passed through a torch optimizer's per-parameter ``state`` and through no
        #: growing container above that optimizer.
        self.optimizer_state = False
        #: The container the holder's name describes, an ``lru_cache`` the walk passed, and
        #: the object whose attribute holds that container (its bound is read from them, and
        #: a later check measures them again through weak references: see :mod:`.bounds`).
        self.named: Any = None
        self.cache: Any = None
        self.way_owner: Any = None
        self.way_attr: str | None = None
        self.graph.ignore.add(id(self.__dict__))

    def _owned(self, obj: Any) -> bool:
        """``obj`` is an element of a container that grew since the previous census (a list
        of models kept by a framework): the walk goes on to name that container."""
        if not self.owners or self.owner_delta is not None:
            return False
        return any(id(r) in self.owners for r in self.graph.referrers(obj))

    def walk(self, target: Any, max_depth: int) -> Holder | None:
        segments: list[str] = []  # innermost first
        kinds = self.kinds  # the hop kind of each segment
        container: str | None = None
        container_len: int | None = None
        via_tb = via_hook = False
        hook_count: int | None = None
        cur = target
        visited = {id(target)}
        self.graph.ignore.add(id(visited))
        self.graph.ignore.add(id(segments))
        self.graph.ignore.add(id(kinds))
        # Element indices below the first named thing are left out of the name (``hoard``, not
        # ``hoard[406]``): the container is described by its type and size instead.
        stripping = True
        if type(target) in CONTAINER_TYPES:
            container, container_len = CONTAINER_TYPES[type(target)], len(target)
            self.elements = elements_of(target)
            self.named = target
            self.name_at = 0
            if id(target) in self.owners:
                self.owner_delta = self.owners[id(target)]
                stripping = False
        elif is_lru_cache(target):
            container, container_len = self._cache(target)
            self.cache = target
            stripping = False
        for _ in range(max_depth):
            if time.thread_time() > self.graph.deadline:
                break
            refs = self.graph.referrers(cur)
            step = self.graph.best_step(cur, refs, visited)
            if step is None:
                # A dead end: the collector cannot see frames that are still running, so the
                # outermost object reached may be a local of a function on some thread's stack.
                live = live_frame_local(cur)
                if live is not None:
                    segments.append(live)
                    kinds.append("frame")
                    return self._holder(segments, "frame", container, container_len, via_tb,
                                        via_hook, hook_count)
                # Only memwatch's own objects refer to it: memwatch's, not a leak. Else the
                # object was reached from native code alone (nothing tracked refers to it).
                self.why = OWN if self.graph.own_seen else \
                    NO_REFERRER if cur is target else CUT
                if self.why == OWN:
                    return None
                break
            kind, label, parent = step.kind, step.label, step.parent
            del step
            self._note_way(cur, kind, label, parent)
            if kind == "base":
                # A numpy array over what was reached (``tensor.numpy()``, a view): the same
                # memory; the walk goes on from the array, nothing is named for it.
                visited.add(id(parent))
                if self.elements is None and stripping:
                    self.elements = element_name(parent)
                cur = parent
                continue
            if kind == "cache":
                # functools.lru_cache / cache: the cache is the container, whatever key or
                # result below it the walk came through; named by the function it wraps.
                segments.clear()
                kinds.clear()
                container, container_len = self._cache(parent)
                stripping = False
                segments.append(label)
                kinds.append(kind)
                visited.add(id(parent))
                cur = parent
                continue
            owner = _container_of(kind, label, parent)
            if kind == "attr_dict" and label.startswith(".state[") and _is_optimizer(parent):
                self.optimizer_state = True
            elif self.optimizer_state and owner is not None and id(owner) in self.owners:
                self.optimizer_state = False  # optimizers themselves accumulate
            if owner is not None and id(owner) in self.owners and self.owner_delta is None:
                # The growing owner: what was below it (an element, a key) leaves the name.
                segments.clear()
                kinds.clear()
                self.name_at = 0
                container = CONTAINER_TYPES.get(type(owner), kind)
                container_len = len(owner)
                self.elements = elements_of(owner)
                self.owner_delta = self.owners[id(owner)]
                self.named = owner
                stripping = False
                del owner
                if kind == "attr_dict":  # ``.cache[key]``: the attribute names the owner
                    segments.append(label.split("[", 1)[0])
                    kinds.append(kind)
                visited.add(id(parent))
                cur = parent
                continue
            del owner
            if stripping and is_index(kind, label):
                container = "dict" if kind == "attr_dict" else kind
                box: Any = getattr(parent, label[1:].split("[", 1)[0], None) \
                    if kind == "attr_dict" else parent
                container_len = len(box) if hasattr(box, "__len__") else None
                self.elements = element_name(cur)
                self.named = box
                self.name_at = 0
                if kind == "attr_dict":  # ``.cache[key]``: keep the attribute's name
                    segments.append(label.split("[", 1)[0])
                    kinds.append(kind)
                    stripping = False
                visited.add(id(parent))
                cur = parent
                continue
            stripping = False
            if container is None and kind == "attr_dict":
                container = "dict"
                held: Any = getattr(parent, label[1:].split("[", 1)[0], None)
                container_len = len(held) if hasattr(held, "__len__") else None
                self.named = held
                self.name_at = len(segments)
                del held
            elif container is None and kind in ("list", "dict", "deque", "set", "tuple"):
                container = kind
                self.named = cur if kind != "dict" else parent
                self.name_at = len(segments) + 1
                try:
                    container_len = len(self.named)
                except TypeError:
                    container_len = None
            if kind == "global":
                segments.append(label)
                kinds.append(kind)
                return self._holder(segments, "global", container, container_len, via_tb,
                                    via_hook, hook_count)
            if kind == "frame":
                segments.append(label)
                kinds.append(kind)
                # A frame is a root unless a traceback keeps it: keep walking to find that.
                via_tb_before = via_tb
                f_refs = self.graph.referrers(parent)
                tbs = self.graph.own([r for r in f_refs if isinstance(r, types.TracebackType)])
                if not tbs:
                    return self._holder(segments, "traceback" if via_tb_before else "frame",
                                        container, container_len, via_tb, via_hook, hook_count)
                via_tb = True
                segments.append(".__traceback__")
                kinds.append("traceback")
                cur = self.graph.exception_for(tbs[0]) or tbs[0]
                visited.add(id(cur))
                continue
            if kind in ("attr", "attr_dict") and is_root_module(parent) and \
                    not self.graph.inside_module(parent) and not self._owned(parent):
                # The outermost nn.Module: its class name reads better than the route by which
                # some trainer happens to reach it.
                segments.append(label)
                kinds.append(kind)
                segments.append(type(parent).__name__)
                kinds.append("module")
                return self._holder(segments, "attribute", container, container_len, via_tb,
                                    via_hook, hook_count)
            hook_attr = label[1:].split("[", 1)[0] if label.startswith(".") else ""
            if hook_attr in HOOK_DICTS:
                via_hook = True
                hooks = getattr(parent, hook_attr, None)
                hook_count = len(hooks) if hooks is not None else None
            segments.append(label)
            kinds.append(kind)
            visited.add(id(parent))
            cur = parent
        if not segments:
            return None
        return self._holder(segments, "unknown", container, container_len, via_tb, via_hook,
                            hook_count)

    def _cache(self, wrapper: Any) -> tuple[str, int | None]:
        """A functools cache as the named container: its entries now (``cache_info()``), what
        its results are, and whether it grew since the previous census."""
        self.cache_name = str(getattr(wrapper, "__name__", "") or "") or None
        self.owner_delta = self.owners.get(id(wrapper), self.owner_delta)
        self.elements = "results"
        try:
            return "lru_cache", int(wrapper.cache_info().currsize)
        except Exception:  # noqa: BLE001 - a look-alike without cache_info
            return "lru_cache", None

    def _holder(self, segments: list[str], root: str, container: str | None,
                container_len: int | None, via_tb: bool, via_hook: bool,
                hook_count: int | None) -> Holder:
        path = "".join(reversed(segments)).removeprefix(" → ")
        if via_hook and root in ("global", "unknown"):
            root = "hook"
        elif via_tb:
            root = "traceback"
        name = self.cache_name if container == "lru_cache" else \
            short_name(self.kinds, segments, self.name_at or 0)
        # The bound is the cache's when the walk went through an lru_cache, else the named
        # container's own (a deque's maxlen).
        box = self.cache if self.cache is not None else self.named
        try:
            return Holder(path, root, container, container_len, via_tb, via_hook, hook_count,
                          self.elements if container is not None else None,
                          owner_delta=self.owner_delta, optimizer_state=self.optimizer_state,
                          name=name, bound=bound_of(box) if box is not None else None,
                          measure=measurer(box, self.way_owner, self.way_attr)
                          if box is not None else None)
        finally:
            self.named = self.cache = self.way_owner = box = None

    def _note_way(self, cur: Any, kind: str, label: str, parent: Any) -> None:
        """Remember an lru_cache the walk goes through, and who holds the named container by
        which name (a ``list`` or ``dict`` takes no weak reference: its owner's attribute is
        the way back to it)."""
        if kind == "cache" and self.cache is None:
            self.cache = parent
        if cur is not self.named or self.way_attr is not None:
            return
        if kind == "attr":
            self.way_owner, self.way_attr = parent, label[1:]
        elif kind == "attr_dict":
            self.way_owner, self.way_attr = parent, label[1:].split("[", 1)[0]
        elif kind == "global":
            mod = self.graph.module_dicts.get(id(parent))
            if mod is not None:
                self.way_owner, self.way_attr = mod, label.rsplit(".", 1)[-1]


def _is_optimizer(obj: Any) -> bool:
    """``obj`` is a ``torch.optim.Optimizer`` (never imports torch)."""
    optim = sys.modules.get("torch.optim")
    cls = getattr(optim, "Optimizer", None)
    return cls is not None and isinstance(obj, cls)


def _container_of(kind: str, label: str, parent: Any) -> Any:
    """The container a step goes through: the parent itself (a list, a dict...), the dict an
    attribute holds (``.cache[key]``), or None (a global, an attribute, a frame...)."""
    if kind in ("list", "deque", "tuple", "set", "dict", "cache"):
        return parent
    if kind == "attr_dict":
        return getattr(parent, label[1:].split("[", 1)[0], None)
    return None

