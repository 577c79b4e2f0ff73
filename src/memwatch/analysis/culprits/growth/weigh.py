"""Weighing Python objects: the bytes a growing container holds.

A census counts objects; a leak is measured in bytes. A list that gains one 100 KB numpy array
per step gains one 100 KB object per step, and counting it as "one more object" undervalues it a
thousand times. The census records the length of every large container
(:mod:`..census.containers`); between two censuses, a container that grew (or a large one that is
new) is weighed here: a sample of its new elements, each weighed deeply (``numpy`` arrays by
``nbytes`` of the array that owns the memory, tensors by storage, strings / bytes / buffers by
``sys.getsizeof``, containers and instances' attributes followed, autograd graphs by
:mod:`..census.graphs`), scaled to the number of new elements.
"""

from __future__ import annotations

import collections
import itertools
import sys
import types
from typing import Any

from memwatch.analysis.culprits.census import graphs
from memwatch.analysis.culprits.census.containers import cache_entries, user_namespaces
from memwatch.analysis.culprits.census.ownership import is_user_type
from memwatch.analysis.culprits.growth import buffers
from memwatch.analysis.culprits.growth.buffers import Buffer, BufferKey, buffer_of
from memwatch.analysis.evidence import ContainerGrowth

__all__ = ["Scale", "element_name", "new_elements", "objects_for", "weigh_growth"]

#: New elements weighed per growing container; the mean is scaled to all new elements.
SAMPLE = 16
#: Objects visited to weigh one element.
ELEMENT_BUDGET = 2000
#: A container met while weighing with more items than this is weighed by an even sample of
#: this many items, scaled to its length.
BIG_CONTAINER = 64
_PAGE = 4096  # what reading a large str/bytes object writes: its header's page
_HEADER = 112  # an array's or a tensor's Python object, without its buffer

_SHARED = frozenset({type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                     types.CodeType, types.MethodType})
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, memoryview, type(None))


def new_elements(obj: Any, kind: str, len_delta: int, k: int = SAMPLE) -> list[Any]:
    """Up to ``k`` of the ``len_delta`` most recently added elements (evenly spaced)."""
    try:
        n = len(obj)
        dn = max(min(len_delta, n), 1)
        step = max(dn // k, 1)
        if kind in ("list", "deque"):
            return [obj[i] for i in range(n - dn, n, step)][:k]
        if kind == "dict":
            vals = itertools.islice(reversed(obj.items()), 0, dn, step)
            return [kv for kv in vals][:k]
        if kind == "cache":  # a functools cache: its newest entries, (key, result) each
            entries = cache_entries(obj)
            return list(itertools.islice(reversed(entries), 0, dn, step))[:k]
        return list(itertools.islice(iter(obj), k))
    except Exception:  # noqa: BLE001 - mutated under us, exotic subclass
        return []


def element_name(x: Any) -> str:
    """A readable plural for what a container holds: "tensors", "numpy arrays", "dicts"."""
    if _is_tensor(x):
        return "tensors"
    tp = type(x)
    if tp.__name__ == "ndarray" or tp.__name__ == "memmap":
        return "numpy arrays"
    plural = {"str": "strings", "bytes": "bytes objects", "bytearray": "bytearrays",
              "dict": "dicts", "list": "lists", "tuple": "tuples", "float": "floats",
              "int": "ints", "deque": "deques", "set": "sets", "OrderedDict": "dicts",
              "defaultdict": "dicts", "Counter": "dicts"}
    return plural.get(tp.__name__, f"{tp.__name__} objects")


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


class Scale:
    """Weighs objects deeply, counting each object (and each storage / array buffer) once.

    ``pages=True`` weighs what *reading* the objects would write (copy-on-write in a forked
    worker): Python objects' own memory, never the buffers of arrays, tensors, bytes and
    strings beyond their first page (reading changes a reference count, in the header)."""

    def __init__(self, graph: graphs.GraphWalk | None = None, pages: bool = False) -> None:
        self.pages = pages
        self.seen: set[int] = set()
        #: Every buffer met (array memory, tensor storages), by identity: its bytes, and what
        #: owns it (kept alive until :meth:`close`: identities stay theirs).
        self.buffers: dict[BufferKey, int] = {}
        self.owners: dict[BufferKey, Any] = {}
        #: The buffers the last :meth:`weigh` reached, and those of them it met first.
        self.reached: set[BufferKey] = set()
        self.first: list[BufferKey] = []
        self.graph = graph if graph is not None else graphs.GraphWalk(max_nodes=20_000)
        self.graph_nodes = 0
        torch = sys.modules.get("torch")
        np = sys.modules.get("numpy")
        self._tensor = torch.Tensor if torch is not None else None
        self._ndarray = np.ndarray if np is not None else None

    def weigh(self, root: Any, budget: int = ELEMENT_BUDGET) -> int:
        self.reached = set()
        self.first = []
        return self._weigh(root, budget)

    def _weigh(self, root: Any, budget: int) -> int:
        total = 0
        stack = [root]
        keep = []  # objects reached: alive until the end (their ids stay theirs)
        while stack and budget > 0:
            o = stack.pop()
            if id(o) in self.seen:
                continue
            self.seen.add(id(o))
            keep.append(o)
            budget -= 1
            tp = type(o)
            if self.pages and (self._tensor is not None and isinstance(o, self._tensor) or
                               self._ndarray is not None and isinstance(o, self._ndarray)):
                total += _HEADER
                continue
            if self._tensor is not None and isinstance(o, self._tensor):
                total += self._tensor_bytes(o)
                continue
            if self._ndarray is not None and isinstance(o, self._ndarray):
                # a view's memory is its base's: counted once, by the owning array's identity
                total += _HEADER + self._buffer(buffer_of(o))
                continue
            if tp in _SHARED:
                continue  # classes, modules, functions: the program's, not the growth's
            try:
                size = sys.getsizeof(o)
                total += min(size, _PAGE) if self.pages and isinstance(o, _ATOMS) else size
            except Exception:  # noqa: BLE001 - objects whose __sizeof__ fails
                pass
            if isinstance(o, _ATOMS):
                continue
            if tp in (list, tuple, set, frozenset, collections.deque, dict) and \
                    len(o) > BIG_CONTAINER:
                # A large container inside what is weighed (a per-step list of 100,000 floats):
                # weigh an even sample of its items and scale, rather than stop at the budget.
                items = list(itertools.islice(o.items() if isinstance(o, dict) else o, 0, None,
                                              max(len(o) // BIG_CONTAINER, 1)))[:BIG_CONTAINER]
                part = sum(self._weigh(x, max(budget // len(items), 1)) for x in items)
                total += int(part * len(o) / len(items))
                items.clear()
                continue
            if tp in (list, tuple, set, frozenset, collections.deque):
                stack.extend(o)
            elif isinstance(o, dict):
                stack.extend(o.keys())
                stack.extend(o.values())
            elif self.pages or is_user_type(tp):
                # (what a worker reads may be any library's object: an ImageFolder's samples)
                try:
                    d = object.__getattribute__(o, "__dict__")
                except Exception:  # noqa: BLE001
                    continue
                stack.append(d)
        keep.clear()
        return total

    def _buffer(self, b: Buffer | None) -> int:
        """A buffer's bytes the first time it is met, else 0 (noting it reached)."""
        if b is None:
            return 0
        key = b[0]
        self.reached.add(key)
        if key in self.buffers:
            return 0
        self.buffers[key] = b[1]
        self.owners[key] = b[2]
        self.first.append(key)
        return b[1]

    def _tensor_bytes(self, t: Any) -> int:
        n = self._buffer(buffer_of(t))
        try:
            if t.grad_fn is not None:
                nodes = self.graph.add(t)
                self.graph_nodes += nodes
                n += self.graph.last_bytes(nodes)
        except Exception:  # noqa: BLE001 - exotic tensor subclasses
            pass
        return n

    def close(self) -> None:
        self.seen.clear()
        self.buffers.clear()
        self.owners.clear()
        self.reached = set()
        self.graph.close()


def weigh_growth(g: ContainerGrowth, obj: Any, scale: Scale) -> None:
    """Fill ``g.bytes_delta`` and ``g.element``: what the new elements add. Their Python
    objects: the sampled elements' mean weight times the number of new elements. Their buffers
    (arrays, tensor storages): by identity, each counted once — a buffer that several new
    elements share (views of one base) is not multiplied by the elements — and not at all when
    something other than the elements keeps it alive (the views add nothing to a base the
    program holds anyway). Plus the container's own growth."""
    sample = new_elements(obj, g.kind, g.len_delta)
    if not sample:
        return
    nodes_before = scale.graph_nodes
    objects = 0.0  # the sample's Python objects (buffers apart)
    hits: dict[BufferKey, int] = {}  # buffers the sample reached: by how many elements
    for x in sample:
        w = scale.weigh(x)
        objects += w - sum(scale.buffers[k] for k in scale.first)
        for k in scale.reached:
            hits[k] = hits.get(k, 0) + 1
    last = sample[-1]
    # a dict's and a cache's: (key, value)
    g.element = element_name(last[1] if g.kind in ("dict", "cache") else last)
    g.graph_nodes = int((scale.graph_nodes - nodes_before) * g.len_delta / len(sample))
    own = sys.getsizeof(obj) if g.new else 8 * g.len_delta
    g.bytes_delta = objects / len(sample) * g.len_delta + \
        _buffers_added(g, obj, sample, hits, scale) + own


def _buffers_added(g: ContainerGrowth, obj: Any, sample: list[Any], hits: dict[BufferKey, int],
                   scale: Scale) -> float:
    """The bytes of the buffers the new elements keep, each once (see :func:`weigh_growth`)."""
    elements = new_elements(obj, g.kind, g.len_delta, k=buffers.MAX_ELEMENTS)
    looked: set[int] = set()
    pop, read = buffers.population(elements, looked)
    # Shared by several elements: once each. One element's own: as many as such elements (the
    # population read may be a sample of them; the sample weighed, for buffers deeper in the
    # elements than the population reads).
    shared = {k: e[0] for k, e in pop.items() if e[2] > 1}
    shared.update((k, scale.buffers[k]) for k, n in hits.items() if n > 1 and k not in pop)
    private = sum(e[0] for e in pop.values() if e[2] == 1) * g.len_delta / max(read, 1) + \
        sum(scale.buffers[k] for k, n in hits.items() if n == 1 and k not in pop) * \
        g.len_delta / len(sample)
    # Less what something else keeps alive anyway: the shared ones each, the elements' own by
    # the share of the sample's that are.
    owners = {k: scale.owners[k] if k in scale.owners else pop[k][1] for k in shared}
    mine = [k for k, n in hits.items() if n == 1]
    owners.update((k, scale.owners[k]) for k in mine)
    # (the elements' own parts are no "something else": what the population looked into, and
    # every object the sample's weighing visited)
    ignore = {id(obj), id(sample), id(elements), id(pop), id(hits), id(scale.owners),
              id(owners), id(shared), *map(id, elements), *map(id, sample),
              *map(id, pop.values()), *looked, *scale.seen}
    held = buffers.held_elsewhere(owners, ignore) if owners else set()
    owners.clear()
    elements.clear()
    pop.clear()
    total: float = sum(int(b) for k, b in shared.items() if k not in held)
    if mine:
        total += private * (1 - sum(k in held for k in mine) / len(mine))
    else:
        total += private
    return max(total, 0.0)


def objects_for(ids: set[int]) -> dict[int, Any]:
    """Live objects whose ``id`` is in ``ids``: the collector's objects, plus the untracked
    dicts :func:`..census.containers.untracked_dicts` finds (user modules' globals, user
    instances' attributes)."""
    import gc

    out: dict[int, Any] = {}
    if not ids:
        return out
    user: list[Any] = []
    for o in gc.get_objects():
        i = id(o)
        if i in ids:
            out[i] = o
        elif is_user_type(type(o)):
            user.append(o)
    missing = ids - out.keys()
    spaces = user_namespaces(user) if missing else []
    user.clear()
    if missing:
        for ns in spaces:
            if isinstance(ns, dict):
                for v in list(ns.values()):
                    if id(v) in missing:
                        out[id(v)] = v
    spaces.clear()
    return out
