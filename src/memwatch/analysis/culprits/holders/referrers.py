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

from memwatch.analysis.culprits.census.ownership import is_own_file, is_own_module_name, is_own_type
from memwatch.analysis.culprits.holders.frames import frame_local_label
from memwatch.analysis.culprits.holders.names import local_label, module_label
from memwatch.core.redact import redact_text

__all__ = ["HOOK_DICTS", "NAMED", "PRIORITY", "ReferrerGraph", "Step", "is_own_object",
           "is_root_module", "key_label", "safe_dict"]

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

    def __init__(self, budget_s: float) -> None:
        # In this thread's CPU time (the walk runs in one thread): a busy machine stretches the
        # wall clock, not the work, and must not cut a walk short that a quiet one finishes.
        self.deadline = time.thread_time() + budget_s
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
        for r in refs:
            if id(r) in visited:
                continue
            d = self.describe(cur, r)
            if d is not None:
                candidates.append(_Candidate(PRIORITY.get(d[0], 9), Step(*d)))
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
                parent_refs = self.referrers(step.parent)
                for pr in parent_refs:
                    d = self.describe(step.parent, pr)
                    if d is not None and d[0] in NAMED:
                        return step
        return best[0]

    def describe(self, cur: Any, r: Any) -> tuple[str, str, Any] | None:
        """How ``r`` refers to ``cur``: (kind, label, the object to climb to next), or None
        when ``r`` is not worth naming (memwatch's own objects, frames and hooks, a module's
        function globals). Labels never hold an object's repr: only names, and dict keys that
        are short strings or numbers."""
        if is_own_object(r):
            return None
        if isinstance(r, dict):
            key = next((k for k, v in r.items() if v is cur), None)
            if key is None:
                return None
            mod = self.module_dicts.get(id(r))
            if mod is not None:
                return ("global", f"{module_label(mod)}.{key}", r)
            frame_label = frame_local_label(r, key)
            if frame_label is not None:
                return ("frame", frame_label, r)
            owner = self.dict_owner(r)
            if owner is not None:
                attr = _attr_name(owner, r)
                if attr in ("_modules", "_parameters", "_buffers"):
                    return ("attr", f".{key}", owner)
                if attr is not None:
                    return ("attr_dict", f".{attr}[{key_label(key)}]", owner)
                return ("attr", f".{key}", owner)
            return ("dict", f"[{key_label(key)}]", r)
        if isinstance(r, (list, collections.deque)):
            kind = "list" if isinstance(r, list) else "deque"
            return (kind, f"[{_index_of(r, cur)}]", r)
        if isinstance(r, tuple):
            return ("tuple", f"[{_index_of(r, cur)}]", r)
        if isinstance(r, (set, frozenset)):
            return ("set", "{…}", r)
        if isinstance(r, types.CellType):
            fn = self.cell_function(r)
            if fn is not None:
                cells = fn.__closure__ or ()
                idx = next((i for i, c in enumerate(cells) if c is r), None)
                name = fn.__code__.co_freevars[idx] if idx is not None else "?"
                return ("closure", f" → closure variable `{name}` of {fn.__qualname__}()", fn)
            return None  # a cell whose function is gone says nothing useful
        if isinstance(r, types.FrameType):
            if is_own_file(r.f_code.co_filename):
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
        if type(r).__name__ == "_lru_cache_wrapper":
            # functools.lru_cache / functools.cache keep their results in a dict the wrapper
            # owns (no attribute names it): name the cache by the function it wraps.
            name = getattr(r, "__qualname__", "?")
            return ("owner", f" → cache of {name}()", r)
        # An instance whose (managed) attribute values include cur.
        d = safe_dict(r)
        if isinstance(d, dict):
            attr = next((k for k, v in d.items() if v is cur), None)
            if attr is not None:
                return ("attr", f".{attr}", r)
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
NAMED = ("global", "attr", "attr_dict", "closure", "owner")


class Step:
    """One hop up the reference graph. A class of its own (not a tuple) so that the walker can
    recognise and skip its own bookkeeping when it lists referrers."""

    __slots__ = ("kind", "label", "parent")

    def __init__(self, kind: str, label: str, parent: Any) -> None:
        self.kind, self.label, self.parent = kind, label, parent


class _Candidate:
    __slots__ = ("prio", "step")

    def __init__(self, prio: int, step: Step) -> None:
        self.prio, self.step = prio, step


#: Which referrer names a holder best: names first, anonymous containers last.
PRIORITY = {
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


def is_own_object(obj: Any) -> bool:
    """memwatch's own object, function, bound method or closure: never a holder (memwatch's
    hooks and wrappers hold what they watch)."""
    tp = type(obj)
    if is_own_type(tp):
        return True
    if tp is types.FunctionType:
        return is_own_module_name(getattr(obj, "__module__", "") or "")
    if tp is types.MethodType:
        return is_own_object(obj.__func__) or is_own_type(type(obj.__self__))
    return False


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
