"""Tensor census: *what* is growing.

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


def _type_name(tp: type) -> str | None:
    mod = getattr(tp, "__module__", None)
    if isinstance(mod, str) and (mod == "memwatch" or mod.startswith("memwatch.")):
        return None
    return tp.__qualname__


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
    # memwatch's own objects (samples, findings, censuses kept for the next diff) grow with the
    # run by design: they are never a culprit, so they are not counted.
    type_name: dict[type, str | None] = {}
    objs = gc.get_objects()
    for o in objs:
        tp = type(o)
        if count_types:
            name = type_name.get(tp, "")
            if name == "":
                name = type_name[tp] = _type_name(tp)
            if name is not None:
                type_counts[name] += 1
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
