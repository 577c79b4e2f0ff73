"""Tensor census and holder naming: *what* is growing and *who* holds it.

A census walks the garbage collector's objects once, groups live tensors by (device, dtype, shape,
requires_grad, grad_fn type) and deduplicates bytes by storage (views share one). Diffing two
censuses taken at epoch ends names the groups that grew; for a growing group, a bounded walk up
``gc.get_referrers`` names the holder: a module global (``train.py: history``), an attribute
(``model.fc._forward_hooks``), a closure cell, or a frame kept alive by a stored traceback.

Costs are measured and returned with every result; nothing here ever runs per step.
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

GroupKey = tuple[str, str, tuple[int, ...], bool, str]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_MAX_IDS_PER_GROUP = 4096


@dataclasses.dataclass
class Group:
    device: str
    dtype: str
    shape: tuple[int, ...]
    requires_grad: bool
    grad_fn: str  # "" when the tensor has no autograd history
    count: int = 0
    bytes: int = 0
    ids: list[int] = dataclasses.field(default_factory=list)

    @property
    def key(self) -> GroupKey:
        return (self.device, self.dtype, self.shape, self.requires_grad, self.grad_fn)

    def describe(self) -> str:
        shape = "x".join(str(s) for s in self.shape) or "scalar"
        s = f"{self.dtype.replace('torch.', '')}[{shape}] on {self.device}"
        if self.grad_fn:
            s += f", grad_fn={self.grad_fn}"
        elif self.requires_grad:
            s += ", requires_grad"
        return s

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "requires_grad": self.requires_grad,
            "grad_fn": self.grad_fn or None,
            "count": self.count,
            "bytes": self.bytes,
        }


@dataclasses.dataclass
class Census:
    """A census of live tensors and of Python objects by type."""

    groups: dict[GroupKey, Group]
    tensors: int
    tensor_bytes: dict[str, int]  # per device
    objects: int
    types: collections.Counter[str]
    elapsed_ms: float
    taken_at: float

    def to_dict(self, top_n: int = 20) -> dict[str, Any]:
        top = sorted(self.groups.values(), key=lambda g: (g.bytes, g.count), reverse=True)
        return {
            "tensors_scanned": self.tensors,
            "objects_scanned": self.objects,
            "total_bytes": sum(self.tensor_bytes.values()),
            "bytes_by_device": dict(self.tensor_bytes),
            "elapsed_ms": round(self.elapsed_ms, 2),
            "groups": [g.to_dict() for g in top[:top_n]],
        }


def _torch() -> Any | None:
    return sys.modules.get("torch")


def take_census(collect: bool = False, count_types: bool = True) -> Census:
    """Walk live objects once. ``collect=True`` runs ``gc.collect()`` first (only garbage that
    cycles keep would otherwise be counted; what survives a collection is really held).

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
    seen_storage: set[tuple[str, int]] = set()
    type_counts: collections.Counter[str] = collections.Counter()
    n_tensors = 0
    # issubclass once per type, not per object: it allocates a little each call (traced one by
    # one when tracemalloc runs), a dict lookup by type does not.
    is_tensor: dict[type, bool] = {}
    objs = gc.get_objects()
    for o in objs:
        tp = type(o)
        if count_types:
            type_counts[tp.__qualname__] += 1
        if tensor_type is None:
            continue
        # type() and issubclass, not isinstance: isinstance consults ``__class__``, which some
        # lazy objects turn into a deprecation warning or an import.
        t = is_tensor.get(tp)
        if t is None:
            t = is_tensor[tp] = issubclass(tp, tensor_type)
        if not t:
            continue
        try:
            if type(o).__name__ == "Parameter" or o.is_meta:
                # Parameters are the model, not a leak candidate; keep them out of the diff but
                # count their bytes.
                pass
            dev = str(o.device)
            gfn = o.grad_fn
            key: GroupKey = (
                dev,
                str(o.dtype),
                tuple(int(s) for s in o.shape),
                bool(o.requires_grad),
                type(gfn).__name__ if gfn is not None else "",
            )
            nbytes = 0
            if o.layout == torch.strided and not o.is_meta:  # type: ignore[union-attr]
                st = o.untyped_storage()
                sk = (dev, int(st.data_ptr()))
                if sk not in seen_storage or sk[1] == 0:
                    seen_storage.add(sk)
                    nbytes = int(st.nbytes())
        except Exception:  # noqa: BLE001 - exotic tensor subclasses: skip, never fail
            continue
        n_tensors += 1
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(*key)
        g.count += 1
        g.bytes += nbytes
        if len(g.ids) < _MAX_IDS_PER_GROUP:
            g.ids.append(id(o))
        tensor_bytes[dev] += nbytes
    n_objects = len(objs)
    del objs
    return Census(groups, n_tensors, dict(tensor_bytes), n_objects, type_counts,
                  (time.perf_counter() - t0) * 1000.0, time.time())


def tensor_census(top_n: int = 20) -> dict[str, Any]:
    """A JSON-able census of live tensors: the largest groups first (used by OOM bundles)."""
    c = take_census()
    return c.to_dict(top_n)


@dataclasses.dataclass
class GroupGrowth:
    group: Group
    count_delta: int
    bytes_delta: int
    new_ids: list[int]


def diff(prev: Census, cur: Census, device_prefix: str | None = None) -> list[GroupGrowth]:
    """Groups that grew between two censuses, largest growth first."""
    out = []
    for key, g in cur.groups.items():
        if device_prefix is not None and not key[0].startswith(device_prefix):
            continue
        p = prev.groups.get(key)
        dc = g.count - (p.count if p else 0)
        db = g.bytes - (p.bytes if p else 0)
        if dc <= 0 and db <= 0:
            continue
        old = set(p.ids) if p else set()
        new_ids = [i for i in g.ids if i not in old]
        out.append(GroupGrowth(g, dc, db, new_ids))
    out.sort(key=lambda x: (x.bytes_delta, x.count_delta), reverse=True)
    return out


def type_growth(prev: Census, cur: Census, top: int = 5) -> list[tuple[str, int]]:
    deltas = [(k, v - prev.types.get(k, 0)) for k, v in cur.types.items()]
    return sorted([d for d in deltas if d[1] > 0], key=lambda d: d[1], reverse=True)[:top]


# --------------------------------------------------------------------------- graph cost

def graph_bytes(tensor: Any, max_nodes: int = 2000) -> tuple[int, int]:
    """(saved-tensor bytes, nodes) reachable from ``tensor.grad_fn``: what keeping it holds.

    Walks ``next_functions`` breadth-first, summing each node's ``_saved_*`` tensors (deduplicated
    by storage). Bounded by ``max_nodes``.
    """
    torch = _torch()
    fn = getattr(tensor, "grad_fn", None)
    if fn is None or torch is None:
        return 0, 0
    seen_nodes: set[int] = set()
    seen_storage: set[int] = set()
    total = 0
    queue = collections.deque([fn])
    while queue and len(seen_nodes) < max_nodes:
        node = queue.popleft()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            try:
                v = getattr(node, name)
            except Exception:  # noqa: BLE001 - freed buffers raise; that's fine
                continue
            for t in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(t, torch.Tensor):
                    try:
                        st = t.untyped_storage()
                        ptr = int(st.data_ptr())
                        if ptr not in seen_storage:
                            seen_storage.add(ptr)
                            total += int(st.nbytes())
                    except Exception:  # noqa: BLE001
                        continue
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None:
                queue.append(nxt)
    return total, len(seen_nodes)


# --------------------------------------------------------------------------- holders

@dataclasses.dataclass
class Holder:
    """Where a leaking object is held: a readable path and what kind of root it hangs from."""

    path: str
    root: str  # "global", "attribute", "closure", "frame", "traceback", "hook", "unknown"
    container: str | None = None  # type of the innermost container, e.g. "list"
    container_len: int | None = None
    via_traceback: bool = False
    via_hook: bool = False
    hook_count: int | None = None


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


def holder_of(target: Any, max_depth: int = 10, budget_s: float = 2.0) -> Holder | None:
    """Name what keeps ``target`` alive (bounded walk upwards). The caller's own containers
    must not hold it (they would be reported); its frames are skipped when they run memwatch's
    code, so pass it from there or through :func:`find_holder`."""
    walker = _Walker(budget_s)
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
                    where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
                    return f" → local `{key}` of running {f.f_code.co_name}() ({where})"
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
                            code = f.f_code
                            where = f"{os.path.basename(code.co_filename)}:{f.f_lineno}"
                            return f" → local `{name}` of running {code.co_name}() ({where})"
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
        return Holder(path, root, container, container_len, via_tb, via_hook, hook_count)

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
                return ("global", f"{_module_label(mod)}: {key}", r)
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
            code = r.f_code
            where = f"{os.path.basename(code.co_filename)}:{r.f_lineno}"
            return ("frame", f" → local `{name}` of {code.co_name}() ({where})", r)
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


def _module_label(mod: types.ModuleType) -> str:
    f = getattr(mod, "__file__", None)
    return os.path.basename(str(f)) if f else str(mod.__name__)
