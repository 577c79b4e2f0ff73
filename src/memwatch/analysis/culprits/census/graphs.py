"""Autograd graphs as growth: what a live tensor's ``grad_fn`` chain holds.

A tensor kept with its history keeps every node reachable through ``next_functions`` alive, and
the tensors those nodes saved for backward. After ``backward()`` the saved tensors are freed but
the nodes are not: a running sum kept without ``.item()`` / ``.detach()`` (``total += loss``)
chains one more step's graph onto one live tensor every step. No tensor group grows (it is one
tensor), so the census counts the chain's nodes instead, and values them:

* **native size per node**: :data:`NODE_BYTES`, measured by ``benchmarks/bench_graph_nodes.py``
  (glibc's in-use bytes per node of a chain of small training steps whose ``backward()`` already
  ran: 650-700 B per node on torch 2.13, CPU; 1.1 KB while the saved tensors are still there);
* **saved tensors**: the ``_saved_*`` tensors still alive of the first nodes reached from each
  tensor (:data:`CALL_SAMPLE_NODES`, up to :data:`SAVED_SAMPLE_NODES` in a walk), deduplicated
  by storage, scaled to that tensor's nodes: a graph is valued by its own saved tensors, and
  those ``backward()`` freed are not held.

Node wrappers are Python objects created on access and freed when dropped, so their ``id`` may
be reused: the walk keeps every node it met alive until it ends (bounded by ``max_nodes``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: Native bytes one autograd node keeps once its saved tensors are freed (measured; see above).
NODE_BYTES = 650
#: Nodes whose saved tensors are read in one walk (reading one costs a few microseconds) ...
SAVED_SAMPLE_NODES = 4000
#: ... and at most this many of the nodes first reached from one tensor: each graph's saved
#: tensors are estimated from its own nodes, never from another graph's (the step in
#: progress holds its activations; a kept output whose ``backward()`` ran holds none).
CALL_SAMPLE_NODES = 32

_saved_names: dict[type, tuple[str, ...]] = {}


def own_storage(t: Any) -> Any | None:
    """The storage holding ``t``'s bytes, or None when ``t`` has none of its own: not a tensor, a
    non-strided tensor, or a wrapper subclass such as ``DTensor`` (FSDP2's sharded parameters and
    their optimizer state), whose storage cannot be read and whose bytes are its local tensor's,
    a live tensor of its own that the census counts where it is."""
    try:
        st = t.untyped_storage()
        st.data_ptr()  # a wrapper subclass's storage raises here ("invalid python storage")
        return st
    except Exception:  # noqa: BLE001
        return None


@dataclasses.dataclass
class GraphWalk:
    """Nodes reached from some tensors' ``grad_fn`` in one walk, shared nodes counted once."""

    max_nodes: int = 250_000
    nodes: int = 0
    saved_bytes_sampled: int = 0
    sampled_nodes: int = 0
    truncated: bool = False
    #: The saved tensors' bytes (still alive) of the nodes the last :meth:`add_node` reached,
    #: estimated from its own sample of them; 0 when ``backward()`` freed them (or no sample
    #: was left to take).
    last_saved: int = 0
    _seen: dict[int, Any] = dataclasses.field(default_factory=dict)
    _storages: set[int] = dataclasses.field(default_factory=set)

    def add(self, tensor: Any) -> int:
        """Walk the graph behind ``tensor``; return the number of nodes not met before."""
        fn = getattr(tensor, "grad_fn", None)
        if fn is None:
            return 0
        return self.add_node(fn)

    def add_node(self, fn: Any) -> int:
        seen = self._seen
        stack = [fn]
        new = 0
        call_sampled = call_saved = 0
        while stack:
            if len(seen) >= self.max_nodes:
                self.truncated = True
                break
            node = stack.pop()
            key = id(node)
            if key in seen:
                continue
            seen[key] = node  # alive until the walk ends: ids of dropped wrappers are reused
            new += 1
            if self.sampled_nodes < SAVED_SAMPLE_NODES and call_sampled < CALL_SAMPLE_NODES:
                self.sampled_nodes += 1
                call_sampled += 1
                saved = self._saved_bytes(node)
                self.saved_bytes_sampled += saved
                call_saved += saved
            try:
                nxt = node.next_functions
            except Exception:  # noqa: BLE001 - exotic nodes: count, do not follow
                continue
            for child, _ in nxt:
                if child is not None and id(child) not in seen:
                    stack.append(child)
        self.nodes += new
        self.last_saved = int(call_saved * new / call_sampled) if call_sampled else 0
        return new

    def last_bytes(self, nodes: int) -> int:
        """What the ``nodes`` the last :meth:`add_node` reached hold: the nodes themselves and
        the saved tensors still alive among them."""
        return nodes * NODE_BYTES + self.last_saved

    def _saved_bytes(self, node: Any) -> int:
        tp = type(node)
        names = _saved_names.get(tp)
        if names is None:
            names = _saved_names[tp] = tuple(n for n in dir(tp) if n.startswith("_saved_"))
        total = 0
        for name in names:
            try:
                v = getattr(node, name)
            except Exception:  # noqa: BLE001 - freed by backward(): nothing held
                continue
            for t in v if isinstance(v, (tuple, list)) else (v,):
                st = own_storage(t)
                if st is None:  # not a tensor, or one without a storage of its own
                    continue
                ptr = int(st.data_ptr())
                if ptr and ptr not in self._storages:
                    self._storages.add(ptr)
                    total += int(st.nbytes())
        return total

    def close(self) -> None:
        self._seen.clear()
        self._storages.clear()


def graph_size(tensor: Any, max_nodes: int = 2000) -> tuple[int, int]:
    """(estimated bytes, nodes) the graph behind one tensor holds."""
    w = GraphWalk(max_nodes=max_nodes)
    try:
        n = w.add(tensor)
        return w.last_bytes(n), n
    finally:
        w.close()
