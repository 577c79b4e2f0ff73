"""Holder naming: *who* keeps a growing object alive.

For one object of a growing group, a bounded walk up ``gc.get_referrers`` names the holder: a
module global (``train.py: history``), an attribute (``model.fc._forward_hooks``), a closure
cell, a local of a running function, or a frame kept alive by a stored traceback. Bounded in
depth and time; memwatch's own frames and bookkeeping are never reported.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import os
import sys
import time
import types
from typing import Any

from memwatch.analysis.names import elements_of, is_index, local_label, module_label
from memwatch.analysis.weigh import CONTAINER_TYPES, element_name

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _torch() -> Any | None:
    return sys.modules.get("torch")


@dataclasses.dataclass
class Holder:
    """Where a leaking object is held: a readable path and what kind of root it hangs from."""

    path: str  # the holder's name: element indices below the named container left out
    root: str  # "global", "attribute", "closure", "frame", "traceback", "hook", "unknown"
    container: str | None = None  # the named container's type, e.g. "list"
    container_len: int | None = None
    via_traceback: bool = False
    via_hook: bool = False
    hook_count: int | None = None
    elements: str | None = None  # what the named container holds, e.g. "numpy arrays"

    def describe(self, delta: int | None = None) -> str:
        """``Net.kept_features (list, 1000 tensors, +250 since the last check)``."""
        if self.container is None:
            return self.path
        parts = [self.container]
        if self.container_len is not None:
            parts.append(f"{self.container_len} {self.elements or 'items'}")
        if delta:
            parts.append(f"+{delta} since the last check")
        return f"{self.path} ({', '.join(parts)})"


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)


def find_holder(obj_id: int, max_depth: int = 10, budget_s: float = 2.0) -> Holder | None:
    """Name what keeps the object with ``id(obj) == obj_id`` alive (bounded walk upwards)."""
    target = _object_by_id(obj_id)
    if target is None:
        return None
    return holder_of(target, max_depth, budget_s)


def holder_of(target: Any, max_depth: int = 10, budget_s: float = 2.0,
              ignore: tuple[int, ...] = ()) -> Holder | None:
    """Name what keeps ``target`` alive (bounded walk upwards). The caller's own containers
    must not hold it (they would be reported) unless their ids are in ``ignore``; its frames
    are skipped when they run memwatch's code, so pass it from there or through
    :func:`find_holder`."""
    walker = _Walker(budget_s)
    walker.ignore.update(ignore)
    try:
        return walker.walk(target, max_depth)
    finally:
        # Break the walker's reference cycles now, so no later walk meets its leftovers.
        walker._keep.clear()
        walker.ignore.clear()


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
    def __init__(self, budget_s: float) -> None:
        self.deadline = time.perf_counter() + budget_s
        self.module_dicts = {
            id(m.__dict__): m for m in list(sys.modules.values()) if m is not None
            and hasattr(m, "__dict__")
        }
        self.ignore: set[int] = set()
        self.elements: str | None = None
        self._keep: list[Any] = []
        self.ignore.add(id(self._keep))
        self.ignore.add(id(self.__dict__))

    def _referrers(self, obj: Any) -> list[Any]:
        # No local may hold our own frame object: a frame referring to itself forms a cycle
        # that keeps the callers' frames, and their temporaries, alive past this walk.
        # Only memwatch's own frames are skipped: a user's function still running up the stack
        # (the training loop that called end_epoch) is a legitimate holder.
        own = set()
        f: types.FrameType | None = sys._getframe()
        while f is not None:
            if f.f_code.co_filename.startswith(_PKG_DIR):
                own.add(id(f))
            f = f.f_back
        raw = gc.get_referrers(obj)
        refs = [r for r in raw if id(r) not in own and id(r) not in self.ignore
                and type(r) is not _Step and type(r) is not _Candidate]
        # ``raw`` holds our own frames, which hold ``raw``: clear it so no reference cycle of
        # ours outlives this call and shows up as a "holder" in a later walk.
        raw.clear()
        # Keep result lists alive (ids not reused) and ignored by later calls.
        self._keep.append(refs)
        self.ignore.add(id(refs))
        return refs

    def _own(self, lst: list[Any]) -> list[Any]:
        """Register a temporary list of ours so it is never reported as a holder."""
        self._keep.append(lst)
        self.ignore.add(id(lst))
        return lst

    def walk(self, target: Any, max_depth: int) -> Holder | None:
        segments: list[str] = []  # innermost first
        container: str | None = None
        container_len: int | None = None
        via_tb = via_hook = False
        hook_count: int | None = None
        cur = target
        visited = {id(target)}
        self.ignore.add(id(visited))
        self.ignore.add(id(segments))
        # Element indices below the first named thing are left out of the name (``hoard``, not
        # ``hoard[406]``): the container is described by its type and size instead.
        stripping = True
        if type(target) in CONTAINER_TYPES:
            container, container_len = CONTAINER_TYPES[type(target)], len(target)
            self.elements = elements_of(target)
        for _ in range(max_depth):
            if time.perf_counter() > self.deadline:
                break
            refs = self._referrers(cur)
            step = self._best_step(cur, refs, visited)
            if step is None:
                # A dead end: the collector cannot see frames that are still running, so the
                # outermost object reached may be a local of a function on some thread's stack.
                live = self._live_frame_local(cur)
                if live is not None:
                    segments.append(live)
                    return self._holder(segments, "frame", container, container_len, via_tb,
                                        via_hook, hook_count)
                break
            kind, label, parent = step.kind, step.label, step.parent
            del step
            if stripping and is_index(kind, label):
                container = "dict" if kind == "attr_dict" else kind
                box: Any = getattr(parent, label[1:].split("[", 1)[0], None) \
                    if kind == "attr_dict" else parent
                container_len = len(box) if hasattr(box, "__len__") else None
                self.elements = element_name(cur)
                if kind == "attr_dict":  # ``.cache[key]``: keep the attribute's name
                    segments.append(label.split("[", 1)[0])
                    stripping = False
                visited.add(id(parent))
                cur = parent
                continue
            stripping = False
            if container is None and kind == "attr_dict":
                container = "dict"
                held: Any = getattr(parent, label[1:].split("[", 1)[0], None)
                container_len = len(held) if hasattr(held, "__len__") else None
            elif container is None and kind in ("list", "dict", "deque", "set", "tuple"):
                container = kind
                try:
                    container_len = len(cur if kind != "dict" else parent)
                except TypeError:
                    container_len = None
            if kind == "global":
                segments.append(label)
                return self._holder(segments, "global", container, container_len, via_tb,
                                    via_hook, hook_count)
            if kind == "frame":
                segments.append(label)
                # A frame is a root unless a traceback keeps it: keep walking to find that.
                via_tb_before = via_tb
                f_refs = self._referrers(parent)
                tbs = self._own([r for r in f_refs if isinstance(r, types.TracebackType)])
                if not tbs:
                    return self._holder(segments, "traceback" if via_tb_before else "frame",
                                        container, container_len, via_tb, via_hook, hook_count)
                via_tb = True
                segments.append(".__traceback__")
                cur = self._exception_for(tbs[0]) or tbs[0]
                visited.add(id(cur))
                continue
            if kind in ("attr", "attr_dict") and _is_root_module(parent) and \
                    not self._inside_module(parent):
                # The outermost nn.Module: its class name reads better than the route by which
                # some trainer happens to reach it.
                segments.append(label)
                segments.append(type(parent).__name__)
                return self._holder(segments, "attribute", container, container_len, via_tb,
                                    via_hook, hook_count)
            hook_attr = label[1:].split("[", 1)[0] if label.startswith(".") else ""
            if hook_attr in _HOOK_DICTS:
                via_hook = True
                hooks = getattr(parent, hook_attr, None)
                hook_count = len(hooks) if hooks is not None else None
            segments.append(label)
            visited.add(id(parent))
            cur = parent
        if not segments:
            return None
        return self._holder(segments, "unknown", container, container_len, via_tb, via_hook,
                            hook_count)

    def _frame_locals_label(self, d: dict[Any, Any], key: Any) -> str | None:
        """``d`` is the ``f_locals`` snapshot of a live frame: name that frame's variable."""
        for frame in sys._current_frames().values():
            f: types.FrameType | None = frame
            while f is not None:
                if not f.f_code.co_filename.startswith(_PKG_DIR) and f.f_locals is d:
                    return local_label(f, key)
                f = f.f_back
        return None

    def _inside_module(self, mod: Any) -> bool:
        """Is ``mod`` a child of another module (a value of some module's ``_modules``)?"""
        for r in self._referrers(mod):
            if not isinstance(r, dict):
                continue
            for rr in self._referrers(r):
                # the parent module itself (managed dict), or its materialised __dict__
                d = rr if isinstance(rr, dict) else _safe_dict(rr)
                if isinstance(d, dict) and d.get("_modules") is r:
                    return True
        return False

    def _live_frame_local(self, obj: Any) -> str | None:
        """A local variable of a function still running on some thread's stack.

        The collector does not traverse frames that are executing, so ``gc.get_referrers``
        never reports them: look at the live stacks directly.
        """
        for frame in sys._current_frames().values():
            f: types.FrameType | None = frame
            while f is not None:
                if not f.f_code.co_filename.startswith(_PKG_DIR):
                    for name, v in f.f_locals.items():
                        if v is obj:
                            return local_label(f, name)
                f = f.f_back
        return None

    def _exception_for(self, tb: types.TracebackType) -> Any | None:
        # Walk tb_next chains back to the head, then find the exception owning it.
        head = tb
        for _ in range(50):
            prev = self._own(
                [r for r in self._referrers(head) if isinstance(r, types.TracebackType)]
            )
            if not prev:
                break
            head = prev[0]
        for r in self._referrers(head):
            if isinstance(r, BaseException):
                return r
        return head

    def _holder(self, segments: list[str], root: str, container: str | None,
                container_len: int | None, via_tb: bool, via_hook: bool,
                hook_count: int | None) -> Holder:
        path = "".join(reversed(segments)).removeprefix(" → ")
        if via_hook and root in ("global", "unknown"):
            root = "hook"
        elif via_tb:
            root = "traceback"
        return Holder(path, root, container, container_len, via_tb, via_hook, hook_count,
                      self.elements if container is not None else None)

    def _best_step(self, cur: Any, refs: list[Any], visited: set[int]) -> _Step | None:
        """The most informative referrer of ``cur``: (kind, label, parent)."""
        candidates: list[_Candidate] = []
        for r in refs:
            if id(r) in visited:
                continue
            d = self._describe(cur, r)
            if d is not None:
                candidates.append(_Candidate(_PRIORITY.get(d[0], 9), _Step(*d)))
            del d
        if not candidates:
            return None
        candidates.sort(key=lambda c: c.prio)
        best = [c.step for c in candidates if c.prio == candidates[0].prio]
        if len(best) > 1 and best[0].kind in ("list", "deque", "dict", "tuple", "set"):
            # Several anonymous containers: prefer one that is itself directly named (a global,
            # an attribute, a closure variable); temporaries and caches of other libraries
            # are usually not.
            for step in best[:4]:
                parent_refs = self._referrers(step.parent)
                for pr in parent_refs:
                    d = self._describe(step.parent, pr)
                    if d is not None and d[0] in _NAMED:
                        return step
        return best[0]

    def _describe(self, cur: Any, r: Any) -> tuple[str, str, Any] | None:
        if isinstance(r, dict):
            key = next((k for k, v in r.items() if v is cur), None)
            if key is None:
                return None
            mod = self.module_dicts.get(id(r))
            if mod is not None:
                return ("global", f"{module_label(mod)}.{key}", r)
            frame_label = self._frame_locals_label(r, key)
            if frame_label is not None:
                return ("frame", frame_label, r)
            owner = self._dict_owner(r)
            if owner is not None:
                attr = _attr_name(owner, r)
                if attr in ("_modules", "_parameters", "_buffers"):
                    return ("attr", f".{key}", owner)
                if attr is not None:
                    return ("attr_dict", f".{attr}[{key!r}]", owner)
                return ("attr", f".{key}", owner)
            return ("dict", f"[{key!r}]", r)
        if isinstance(r, (list, collections.deque)):
            kind = "list" if isinstance(r, list) else "deque"
            return (kind, f"[{_index_of(r, cur)}]", r)
        if isinstance(r, tuple):
            return ("tuple", f"[{_index_of(r, cur)}]", r)
        if isinstance(r, (set, frozenset)):
            return ("set", "{…}", r)
        if isinstance(r, types.CellType):
            fn = self._cell_function(r)
            if fn is not None:
                cells = fn.__closure__ or ()
                idx = next((i for i, c in enumerate(cells) if c is r), None)
                name = fn.__code__.co_freevars[idx] if idx is not None else "?"
                return ("closure", f" → closure variable `{name}` of {fn.__qualname__}()", fn)
            return None  # a cell whose function is gone says nothing useful
        if isinstance(r, types.FrameType):
            if r.f_code.co_filename.startswith(_PKG_DIR):
                return None  # memwatch's own frames
            name = next((k for k, v in r.f_locals.items() if v is cur), "?")
            return ("frame", local_label(r, name), r)
        if isinstance(r, types.TracebackType):
            return ("traceback", "", r)
        if isinstance(r, BaseException):
            return ("exception", f" ← {type(r).__name__}", r)
        if isinstance(r, types.FunctionType):
            if r.__defaults__ is cur or r.__kwdefaults__ is cur:
                return ("owner", f" → default arguments of {r.__qualname__}()", r)
            if r.__closure__ is cur:
                return ("owner", f" → closure of {r.__qualname__}()", r)
            if r.__globals__ is cur:
                return None
            return ("function", f" ← {r.__qualname__}", r)
        if isinstance(r, types.MethodType):
            return ("method", f" → bound method {r.__func__.__qualname__}", r)
        # An instance whose (managed) attribute values include cur.
        d = _safe_dict(r)
        if isinstance(d, dict):
            attr = next((k for k, v in d.items() if v is cur), None)
            if attr is not None:
                return ("attr", f".{attr}", r)
        return None

    def _dict_owner(self, d: dict[Any, Any]) -> Any | None:
        refs = self._referrers(d)
        for r in refs:
            if _safe_dict(r) is d or _attr_name(r, d) is not None:
                return r
        # ``d`` may be a value inside its owner's materialised ``__dict__``.
        for r in refs:
            if isinstance(r, dict) and id(r) not in self.module_dicts:
                for rr in self._referrers(r):
                    if _safe_dict(rr) is r:
                        return rr
        return None

    def _cell_function(self, cell: types.CellType) -> types.FunctionType | None:
        for r in self._referrers(cell):
            if isinstance(r, tuple):
                for f in self._referrers(r):
                    if isinstance(f, types.FunctionType) and f.__closure__ is r:
                        return f
        return None


_NAMED = ("global", "attr", "attr_dict", "closure", "owner")


class _Step:
    """One hop up the reference graph. A class of its own (not a tuple) so that the walker can
    recognise and skip its own bookkeeping when it lists referrers."""

    __slots__ = ("kind", "label", "parent")

    def __init__(self, kind: str, label: str, parent: Any) -> None:
        self.kind, self.label, self.parent = kind, label, parent


class _Candidate:
    __slots__ = ("prio", "step")

    def __init__(self, prio: int, step: _Step) -> None:
        self.prio, self.step = prio, step


_PRIORITY = {
    "global": 0,
    "attr": 1,
    "attr_dict": 1,
    "owner": 1,
    "closure": 2,
    "frame": 3,
    "exception": 3,
    "traceback": 3,
    "list": 4,
    "deque": 4,
    "dict": 4,
    "tuple": 5,
    "set": 5,
    "function": 6,
    "method": 8,
    "cell": 7,
}


def _is_root_module(obj: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(obj, torch.nn.Module)


def _safe_dict(obj: Any) -> Any:
    try:
        return object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no __dict__, or a proxy that refuses
        return None


def _attr_name(owner: Any, value: Any) -> str | None:
    d = _safe_dict(owner)
    if not isinstance(d, dict):
        return None
    for k, v in d.items():
        if v is value:
            return str(k)
    return None


def _index_of(seq: Any, item: Any) -> str:
    for i, v in enumerate(seq):
        if v is item:
            return str(i)
    return "?"
