"""One hop up the reference graph: who refers to an object, and how a person would name that
reference.

:class:`ReferrerGraph` wraps ``gc.get_referrers`` for one holder walk: it leaves out memwatch's
own frames and the walk's own bookkeeping (lists of referrers it keeps alive so their ids are not
reused, visited sets, steps), describes each referrer as a hop (``global``, ``attr``, ``closure``,
``frame``, a container index...) and picks the most informative one (:data:`PRIORITY`: names a
person can grep for first, anonymous containers last).
"""

from __future__ import annotations

import collections
import gc
import sys
import time
import types
from typing import Any

from memwatch.analysis.culprits.census.ownership import (
    is_framework_object,
    is_own_file,
    is_own_module_name,
    is_own_object,
    is_user_file,
)
from memwatch.analysis.culprits.holders.frames import frame_local_label
from memwatch.analysis.culprits.holders.names import local_label, module_label
from memwatch.analysis.culprits.holders.untracked import ArrayBases, is_array, is_lru_cache
from memwatch.core.redact import redact_text

__all__ = ["HOOK_DICTS", "NAMED", "PRIORITY", "ReferrerGraph", "Step", "is_own_object",
           "is_root_module", "is_tensor", "key_label", "safe_dict"]

#: The attributes of an ``nn.Module`` that hold hooks: a holder reached through one of them is
#: a hook registered again and again.
HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)


class ReferrerGraph:
    """``gc.get_referrers`` for one walk, with the walk's own objects left out."""

    def __init__(self, budget_s: float, arrays: ArrayBases | None = None) -> None:
        # In this thread's CPU time (the walk runs in one thread): a busy machine stretches the
        # wall clock, not the work, and must not cut a walk short that a quiet one finishes.
        self.deadline = time.thread_time() + budget_s
        #: The numpy arrays whose base is an object (the collector does not list them as its
        #: referrers); None: not looked for.
        self.arrays = arrays
        #: The last :meth:`best_step` left out a referrer that is memwatch's own (its module's
        #: globals, its objects, functions, closures): the object is held by memwatch there.
        self.own_seen = False
        self.module_dicts = {
            id(m.__dict__): m for m in list(sys.modules.values()) if m is not None
            and hasattr(m, "__dict__")
        }
        self.ignore: set[int] = set()
        self.keep: list[Any] = []
        self.ignore.add(id(self.keep))
        self.ignore.add(id(self.__dict__))

    def referrers(self, obj: Any) -> list[Any]:
        """What refers to ``obj``, less memwatch's frames and this walk's bookkeeping."""
        # No local may hold our own frame object: a frame referring to itself forms a cycle
        # that keeps the callers' frames, and their temporaries, alive past this walk.
        # Only memwatch's own frames are skipped: a user's function still running up the stack
        # (the training loop that called end_epoch) is a legitimate holder.
        own = set()
        f: types.FrameType | None = sys._getframe()
        while f is not None:
            if is_own_file(f.f_code.co_filename):
                own.add(id(f))
            f = f.f_back
        raw = gc.get_referrers(obj)
        refs = [r for r in raw if id(r) not in own and id(r) not in self.ignore
                and type(r) is not Step and type(r) is not _Candidate]
        # ``raw`` holds our own frames, which hold ``raw``: clear it so no reference cycle of
        # ours outlives this call and shows up as a "holder" in a later walk.
        raw.clear()
        # Keep result lists alive (ids not reused) and ignored by later calls.
        self.keep.append(refs)
        self.ignore.add(id(refs))
        return refs

    def own(self, lst: list[Any]) -> list[Any]:
        """Register a temporary list of ours so it is never reported as a holder."""
        self.keep.append(lst)
        self.ignore.add(id(lst))
        return lst

    def close(self) -> None:
        """Break the walk's reference cycles now, so no later walk meets its leftovers."""
        self.keep.clear()
        self.ignore.clear()

    def best_step(self, cur: Any, refs: list[Any], visited: set[int]) -> Step | None:
        """The most informative referrer of ``cur``: (kind, label, parent)."""
        candidates: list[_Candidate] = []
        self.own_seen = False
        for r in refs:
            if id(r) in visited:
                continue
            d = self.describe(cur, r)
            if d is not None:
                # A framework's bookkeeping (an optimizer's state, a trainer's state, an
                # EvalPrediction) after anything else: the user's container that keeps the same
                # object is the holder to name; the framework's record is passed through.
                candidates.append(_Candidate(
                    PRIORITY.get(d.kind, 9) + (_LATER if is_framework_object(d.parent) else 0)
                    + (_LIBRARY_FRAME if d.library else 0.0),
                    d))
            del d
        if not candidates and self.arrays is not None and (is_array(cur) or is_tensor(cur)):
            # Nothing the collector tracks refers to it: numpy arrays whose base it is may
            # (``tensor.numpy()``, views), and they are not tracked.
            for a in self.arrays.arrays_on(cur):
                if id(a) not in visited:
                    candidates.append(_Candidate(PRIORITY["base"], Step("base", "", a)))
        if not candidates:
            return None
        candidates.sort(key=lambda c: c.prio)
        best = [c.step for c in candidates if c.prio == candidates[0].prio]
        own = self.own_seen
        try:
            if len(best) > 1 and best[0].kind in ("list", "deque", "dict", "tuple", "set"):
                # Several anonymous containers: prefer one that is itself directly named (a
                # global, an attribute, a closure variable); temporaries and caches of other
                # libraries are usually not.
                for step in best[:4]:
                    parent_refs = self.referrers(step.parent)
                    for pr in parent_refs:
                        d = self.describe(step.parent, pr)
                        if d is not None and d.kind in NAMED:
                            return step
            return best[0]
        finally:
            self.own_seen = own

    def describe(self, cur: Any, r: Any) -> Step | None:
        """How ``r`` refers to ``cur``: a :class:`Step` (kind, label, the object to climb to
        next; a type of its own, which no walk mistakes for a holder), or None
        when ``r`` is not worth naming (memwatch's own objects, frames and hooks, a module's
        function globals). Labels never hold an object's repr: only names, and dict keys that
        are short strings or numbers."""
        if is_own_object(r):
            self.own_seen = True
            return None
        d = self._describe(cur, r)
        if d is not None and is_own_object(d.parent):
            # A route through memwatch's own objects (an adapter's attribute, its closure, its
            # bound methods): memwatch holds what it watches; that is nobody's leak. (``d`` is
            # dropped here: a frame of ours that outlives this call must not keep it.)
            self.own_seen = True
            d = None
        return d

    def _describe(self, cur: Any, r: Any) -> Step | None:
        if isinstance(r, dict):
            key = next((k for k, v in r.items() if v is cur), None)
            if key is None:
                return None
            mod = self.module_dicts.get(id(r))
            if mod is not None:
                if is_own_module_name(str(getattr(mod, "__name__", ""))):
                    self.own_seen = True  # memwatch's module-level caches
                    return None
                return Step("global", f"{module_label(mod)}.{key}", r)
            frame_label = frame_local_label(r, key)
            if frame_label is not None:
                return Step("frame", frame_label[0], r, library=not frame_label[1])
            owner = self.dict_owner(r)
            if owner is not None:
                attr = _attr_name(owner, r)
                if attr in ("_modules", "_parameters", "_buffers"):
                    return Step("attr", f".{key}", owner)
                if attr is not None:
                    return Step("attr_dict", f".{attr}[{key_label(key)}]", owner)
                return Step("attr", f".{key}", owner)
            return Step("dict", f"[{key_label(key)}]", r)
        if isinstance(r, (list, collections.deque)):
            kind = "list" if isinstance(r, list) else "deque"
            return Step(kind, f"[{_index_of(r, cur)}]", r)
        if isinstance(r, tuple):
            return Step("tuple", f"[{_index_of(r, cur)}]", r)
        if isinstance(r, (set, frozenset)):
            return Step("set", "{…}", r)
        if isinstance(r, types.CellType):
            fn = self.cell_function(r)
            if fn is not None:
                cells = fn.__closure__ or ()
                idx = next((i for i, c in enumerate(cells) if c is r), None)
                name = fn.__code__.co_freevars[idx] if idx is not None else "?"
                return Step("closure", f" → closure variable `{name}` of {fn.__qualname__}()", fn)
            return None  # a cell whose function is gone says nothing useful
        if isinstance(r, types.FrameType):
            if is_own_file(r.f_code.co_filename):
                return None  # memwatch's own frames
            name = next((k for k, v in r.f_locals.items() if v is cur), "?")
            return Step("frame", local_label(r, name), r,
                        library=not is_user_file(r.f_code.co_filename))
        if isinstance(r, types.TracebackType):
            return Step("traceback", "", r)
        if isinstance(r, BaseException):
            return Step("exception", f" ← {type(r).__name__}", r)
        if isinstance(r, types.FunctionType):
            if r.__defaults__ is cur or r.__kwdefaults__ is cur:
                return Step("owner", f" → default arguments of {r.__qualname__}()", r)
            if r.__closure__ is cur:
                return Step("owner", f" → closure of {r.__qualname__}()", r)
            if r.__globals__ is cur:
                return None
            return Step("function", f" ← {r.__qualname__}", r)
        if isinstance(r, types.MethodType):
            return Step("method", f" → bound method {r.__func__.__qualname__}", r)
        if is_lru_cache(r):
            # functools.lru_cache / functools.cache keep their results in a dict the wrapper
            # owns (no attribute names it): name the cache by the function it wraps.
            name = getattr(r, "__qualname__", "?")
            return Step("cache", f" → cache of {name}()", r)
        # An instance whose (managed) attribute values include cur.
        d = safe_dict(r)
        if isinstance(d, dict):
            attr = next((k for k, v in d.items() if v is cur), None)
            if attr is not None:
                return Step("attr", f".{attr}", r)
        return None

    def dict_owner(self, d: dict[Any, Any]) -> Any | None:
        refs = self.referrers(d)
        for r in refs:
            if safe_dict(r) is d or _attr_name(r, d) is not None:
                return r
        # ``d`` may be a value inside its owner's materialised ``__dict__``.
        for r in refs:
            if isinstance(r, dict) and id(r) not in self.module_dicts:
                for rr in self.referrers(r):
                    if safe_dict(rr) is r:
                        return rr
        return None

    def cell_function(self, cell: types.CellType) -> types.FunctionType | None:
        for r in self.referrers(cell):
            if isinstance(r, tuple):
                for f in self.referrers(r):
                    if isinstance(f, types.FunctionType) and f.__closure__ is r:
                        return f
        return None

    def inside_module(self, mod: Any) -> bool:
        """Is ``mod`` a child of another module (a value of some module's ``_modules``)?"""
        for r in self.referrers(mod):
            if not isinstance(r, dict):
                continue
            for rr in self.referrers(r):
                # the parent module itself (managed dict), or its materialised __dict__
                d = rr if isinstance(rr, dict) else safe_dict(rr)
                if isinstance(d, dict) and d.get("_modules") is r:
                    return True
        return False

    def exception_for(self, tb: types.TracebackType) -> Any | None:
        # Walk tb_next chains back to the head, then find the exception owning it.
        head = tb
        for _ in range(50):
            prev = self.own(
                [r for r in self.referrers(head) if isinstance(r, types.TracebackType)]
            )
            if not prev:
                break
            head = prev[0]
        for r in self.referrers(head):
            if isinstance(r, BaseException):
                return r
        return head


#: Hops whose label is a name a person can grep for.
NAMED = ("global", "attr", "attr_dict", "closure", "owner", "cache")


class Step:
    """One hop up the reference graph. A class of its own (not a tuple) so that the walker can
    recognise and skip its own bookkeeping when it lists referrers."""

    __slots__ = ("kind", "label", "library", "parent")

    def __init__(self, kind: str, label: str, parent: Any, library: bool = False) -> None:
        self.kind, self.label, self.parent = kind, label, parent
        #: A local of a library's running function (named after the user's own).
        self.library = library


class _Candidate:
    __slots__ = ("prio", "step")

    def __init__(self, prio: float, step: Step) -> None:
        self.prio, self.step = prio, step


#: Which referrer names a holder best: names first, anonymous containers last.
PRIORITY = {
    "global": 0,
    "attr": 1,
    "attr_dict": 1,
    "owner": 1,
    "cache": 1,
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
    "base": 5,  # a numpy array over it (untracked by the collector: asked only at a dead end)
}

#: Added to a hop's priority when the object it climbs to is a framework's bookkeeping.
_LATER = 10
#: ... and to a local of a library's running function (the framework's loop, whose ``self`` is
#: the trainer): after the user's own function that holds the same object.
_LIBRARY_FRAME = 0.5


def is_tensor(obj: Any) -> bool:
    """A torch tensor (never imports torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_root_module(obj: Any) -> bool:
    """An ``nn.Module`` (the outermost one names a holder by its class)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def key_label(key: Any) -> str:
    """How a dict key reads in a holder's name: a string (token shapes redacted first, then cut
    to 40 characters) or a number as written, anything else by its type only (never an object's
    repr: a tensor key would print its values).

    Example::

        >>> key_label("grad"), key_label(3), key_label(("a", 1)), len(key_label("x" * 80))
        ("'grad'", '3', '<tuple>', 43)
        >>> key_label("hf_" + "Qz7Lm2Kp4Zr8Tn6Vb3Wc5Yd1Fg0HjKLMNO")
        "'<redacted>'"
    """
    if isinstance(key, str) and key.isprintable():
        shown = redact_text(key)
        return repr(shown[:40]) + ("…" if len(shown) > 40 else "")
    if type(key) in (int, bool) or (type(key) is float and key == key):
        return repr(key)
    return f"<{type(key).__name__}>"


def safe_dict(obj: Any) -> Any:
    """``obj.__dict__`` without ``__getattr__`` hooks, or None."""
    try:
        return object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no __dict__, or a proxy that refuses
        return None


def _attr_name(owner: Any, value: Any) -> str | None:
    d = safe_dict(owner)
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
