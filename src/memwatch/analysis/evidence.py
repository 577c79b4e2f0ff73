"""The one port through which the analyzer reads the live process (:class:`Evidence`), and the
values that come through it: what a census, a weighing, a holder walk and an attribution produce,
and what the rules and their wording read.

Nothing here reads the live process: the port is a protocol and the rest are values. The live
port (:class:`memwatch.analysis.culprits.live.LiveEvidence`) fills them by walking the heap; a
test passes recorded values instead (:class:`memwatch.testing.RecordedEvidence`), so every rule
is testable without a process to look at.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.stats.shapes import EpochStats

__all__ = ["Attribution", "Bound", "Census", "CensusPair", "CensusRecord", "ContainerGrowth",
           "Evidence", "Group", "GroupGrowth", "GroupKey", "Holder", "HolderSize", "WorkerAttr",
           "WorkerGrowth"]

#: (device, dtype, shape, requires_grad, grad_fn type name): what a census groups tensors by.
GroupKey = tuple[str, str, tuple[int, ...], bool, str]


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
    graph_nodes: int = 0  # autograd nodes first reached from this group's tensors
    graph_bytes: int = 0  # their estimated bytes (native nodes + saved tensors)
    graph_saved: int = 0  # of which saved tensors still alive (0 once backward() freed them)
    views: int = 0  # tensors of the group that are views (their bytes: the bases' storages)

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
            "graph_nodes": self.graph_nodes,
            "graph_bytes": self.graph_bytes,
            "graph_saved_bytes": self.graph_saved,
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
    #: id -> (length, kind) of every container of at least ``CONTAINER_MIN_LEN`` items
    #: (memwatch's own left out)
    containers: dict[int, tuple[int, str]] = dataclasses.field(default_factory=dict)
    graph_nodes: int = 0
    graph_truncated: bool = False
    #: The large storages (from 1 MiB) by identity, (device, address) -> (the group that
    #: counts them, bytes): views taken since of a storage counted then add nothing.
    storages: dict[tuple[str, int], tuple[GroupKey, int]] = dataclasses.field(
        default_factory=dict)

    def to_dict(self, top_n: int = 20) -> dict[str, Any]:
        top = sorted(self.groups.values(), key=lambda g: (g.bytes, g.count), reverse=True)
        return {
            "tensors_scanned": self.tensors,
            "objects_scanned": self.objects,
            "total_bytes": sum(self.tensor_bytes.values()),
            "bytes_by_device": dict(self.tensor_bytes),
            "elapsed_ms": round(self.elapsed_ms, 2),
            "graph_nodes": self.graph_nodes,
            "containers_recorded": len(self.containers),
            "groups": [g.to_dict() for g in top[:top_n]],
        }


@dataclasses.dataclass
class GroupGrowth:
    group: Group
    count_delta: int
    bytes_delta: int
    new_ids: list[int]
    graph_nodes_delta: int = 0
    graph_bytes_delta: int = 0
    graph_saved_delta: int = 0  # of the graphs' growth, saved tensors still alive

    @property
    def effective_bytes(self) -> int:
        """What the group's growth holds: its storages plus its autograd graphs' growth."""
        return self.bytes_delta + max(self.graph_bytes_delta, 0)


@dataclasses.dataclass
class ContainerGrowth:
    """A container that grew between two censuses, weighed."""

    obj_id: int
    kind: str  # "list", "dict", "deque", "set"
    length: int
    len_delta: int
    new: bool  # not in the previous census (new, or shorter than CONTAINER_MIN_LEN then)
    bytes_delta: float = 0.0
    element: str = ""  # what the new elements are, e.g. "numpy arrays"
    graph_nodes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "length": self.length, "len_delta": self.len_delta,
                "new": self.new, "bytes_delta": self.bytes_delta, "element": self.element}


@dataclasses.dataclass(frozen=True)
class Bound:
    """A bound the holder carries itself: a ``collections.deque``'s ``maxlen``, a
    ``functools.lru_cache``'s ``maxsize``. Such a container stops growing at ``capacity``
    items whatever the run does, so its growth is judged with that bound, and advice never asks
    for one.

    Example::

        >>> b = Bound("deque", capacity=2000, length=1500)
        >>> b.describe(), b.full, b.left
        ('deque(maxlen=2000)', False, 500)
    """

    kind: str  # "deque" or "lru_cache"
    capacity: int
    length: int

    @property
    def full(self) -> bool:
        return self.length >= self.capacity

    @property
    def left(self) -> int:
        """Items it may still gain."""
        return max(self.capacity - self.length, 0)

    def describe(self) -> str:
        if self.kind == "lru_cache":
            return f"functools.lru_cache(maxsize={self.capacity})"
        return f"deque(maxlen={self.capacity})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "capacity": self.capacity, "length": self.length}


@dataclasses.dataclass(frozen=True)
class HolderSize:
    """A named holder measured again at a later check: its items now, and its own bound."""

    length: int
    bound: Bound | None = None


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
    #: When the holder is a container that grew since the previous census: how many elements
    #: it gained (the owner of the growth; None when no growing container was passed).
    owner_delta: int | None = None
    #: The object is a torch optimizer's per-parameter state (``optimizer.state[p]``), and no
    #: container above that optimizer grew: state created once per parameter, at its first
    #: step, as large as the parameter (bounded while parameters are not added).
    optimizer_state: bool = False
    #: The bound the named container carries itself (``deque.maxlen``, an ``lru_cache``'s
    #: ``maxsize``), as it stood at the walk; None: unbounded, or not a container that says.
    bound: Bound | None = None
    #: Measures the named container again (weakly: it keeps nothing alive): its size and bound
    #: now, or None once it is gone. None when the walk could not keep a way back to it.
    measure: Callable[[], HolderSize | None] | None = dataclasses.field(
        default=None, repr=False, compare=False)
    #: The short name a fix calls the holder by: the growing container's own name, with the
    #: variable that holds it (``processor.last_step_result``, ``EVAL_LOGITS``,
    #: ``train_logits``); the whole route is :attr:`path`. None: no name to give.
    name: str | None = None

    @property
    def shown(self) -> str:
        """How a culprit names it: the path, or the short :attr:`name` when the path is a long
        route (through closures, frames, caches: two hops or more); the route stays in the
        evidence (``evidence["holder"]``)."""
        return f"`{self.name}`" if self.name and self.path.count(" → ") >= 2 else self.path

    def describe(self, delta: int | None = None, since: str = "since the last check") -> str:
        """``Net.kept_features (list, 1000 tensors, +250 since the last check)``."""
        if self.container is None:
            return self.shown
        parts = [self.container]
        if self.container_len is not None:
            parts.append(f"{self.container_len} {self.elements or 'items'}")
        if delta:
            parts.append(f"+{delta} {since}")
        if self.bound is not None:
            parts.append(f"bounded: {self.bound.describe()}")
        if self.via_traceback and ".__traceback__" not in self.path:
            # The route below the named container was left out: it went through tracebacks.
            parts.append("each keeps its traceback, whose frames keep their locals")
        return f"{self.shown} ({', '.join(parts)})"


@dataclasses.dataclass
class CensusRecord:
    """A census taken at one check, with the process's RSS at that check."""

    epoch: int
    census: Census
    rss: float
    step: int = 0  # the optimizer step the census was taken at


@dataclasses.dataclass
class Attribution:
    """What explains one metric's growth between two censuses.

    Attributes:
        census_note: why there is no census diff (``census="never"``, or not taken at two
            checks yet); None when there is one.
        group: the growing group of live tensors named as the culprit, or
        container: the growing container named as the culprit (each the largest growth in
            bytes, autograd graphs and views' bases included, whose holder could be named).
        holder: who keeps one of that group's new objects alive.
        graph_bytes: bytes the group's autograd graphs grew by (nodes and saved tensors).
        explained_bytes / rss_growth_bytes: host only: what live objects explain of the RSS
            growth between the two censuses.
        retention: host growth that live objects do not explain (allocator retention).
        own_growth: the growth is memwatch's own tracing bookkeeping.
        site: the allocation site named when no holder of tensors was (tracing on).
    """

    census_note: str | None = None
    census_ms: float | None = None
    objects_scanned: int | None = None
    tensors_scanned: int | None = None
    census_epochs: list[int] | None = None
    #: The optimizer steps of the two censuses diffed (what a run without epochs is told).
    census_at_steps: list[int] | None = None
    #: The step the unit judged began at (the previous check's): a census pair that starts
    #: before it spans more than "since the last check".
    unit_from_step: int | None = None
    growing_groups: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    python_object_growth: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    group: GroupGrowth | None = None
    container: ContainerGrowth | None = None
    chosen: Any = None  # the candidate named (group or container)
    containers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    graph_nodes: int = 0
    #: Nodes of the named tensor's autograd graph now (when the culprit is a growing graph).
    graph_nodes_named: int = 0
    alloc_sites: list[Any] = dataclasses.field(default_factory=list)  # device_sites.AllocSite
    holder: Holder | None = None
    graph_bytes: int = 0
    #: Of ``graph_bytes``, the saved tensors still alive (0: ``backward()`` freed them, only
    #: the graph's nodes are held).
    graph_saved_bytes: int = 0
    effective_bytes: float = 0.0
    attribution_ms: float | None = None
    explained_bytes: float | None = None
    rss_growth_bytes: float | None = None
    retention: bool = False
    own_growth: bool = False
    tracemalloc: list[dict[str, Any]] | None = None
    tracemalloc_summary: dict[str, Any] | None = None
    site: Any = None  # sites.SiteGrowth
    #: Why no holder was named for what grew (said with the culprit's shape), e.g. that
    #: nothing in Python refers to it; None when a holder was named or none was looked for.
    holder_note: str | None = None
    #: Optimizer steps between the two censuses diffed (0: unknown).
    census_steps: int = 0
    #: The run has epochs (advice says "at the epoch end"; a run of checks only, "regularly").
    epochs: bool = True

    def evidence(self) -> dict[str, Any]:
        """The keys a finding's evidence carries about its attribution."""
        ev: dict[str, Any] = {}
        if self.census_note is not None:
            ev["census"] = self.census_note
        else:
            ev.update(census_ms=self.census_ms, objects_scanned=self.objects_scanned,
                      tensors_scanned=self.tensors_scanned, census_epochs=self.census_epochs,
                      census_at_steps=self.census_at_steps,
                      growing_groups=self.growing_groups,
                      python_object_growth=self.python_object_growth,
                      growing_containers=self.containers[:8], graph_nodes=self.graph_nodes)
            if self.attribution_ms is not None:
                ev["attribution_ms"] = self.attribution_ms
            if self.group is not None:
                ev["graph_bytes"] = self.graph_bytes
                ev["graph_saved_bytes"] = self.graph_saved_bytes
                ev["graph_nodes_delta"] = self.group.graph_nodes_delta
                if self.graph_nodes_named:
                    ev["graph_nodes_named"] = self.graph_nodes_named
            if self.chosen is not None:
                ev["culprit_bytes"] = self.chosen.bytes
        for name in ("explained_bytes", "rss_growth_bytes", "tracemalloc",
                     "tracemalloc_summary"):
            v = getattr(self, name)
            if v is not None:
                ev[name] = v
        if self.alloc_sites:
            ev["alloc_sites"] = [a.to_dict() for a in self.alloc_sites]
        h = self.holder
        if h is not None:
            ev["holder"] = h.path
            ev["holder_root"] = h.root
            ev["hook_count"] = h.hook_count
            if h.owner_delta is not None:
                ev["holder_grew_by"] = h.owner_delta
            if h.optimizer_state:
                ev["holder_optimizer_state"] = True
            if h.container_len is not None:
                ev["holder_len"] = h.container_len
            if h.bound is not None:
                ev["holder_bound"] = h.bound.to_dict()
            if h.name:
                ev["holder_name"] = h.name
        elif self.holder_note:
            ev["holder_note"] = self.holder_note
        return ev


@dataclasses.dataclass
class WorkerAttr:
    """A container of the Dataset that grew inside DataLoader workers since the last check, from
    their own censuses (:mod:`memwatch.analysis.culprits.worker_census`)."""

    name: str  # ``CachingDataset.cache``, ``data.CACHE``, ``CachingDataset.reader.cache``
    kind: str  # "list", "dict", "set", "deque", "cache"
    length: int  # its length now, in the worker where it is longest
    len_delta: int  # elements each worker added since its previous census (mean)
    bytes_delta: float  # what those elements weigh, per worker (mean)
    element: str  # what they are, e.g. "tensors"
    workers: int  # in how many workers it grew
    #: Elements each gained in the stretch between checks before that (mean; 0: it did not
    #: grow then, or the workers started since).
    before: int = 0
    #: ... and in the stretch before that (a stretch shorter than a worker's poll shows
    #: nothing of its own: what it made counts in the next).
    earlier: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class WorkerGrowth:
    """What the DataLoader workers' own censuses say at a check: the containers of the Dataset
    that grew in them, the most bytes first (empty: none grew, or no worker answered)."""

    answered: int = 0  # workers whose census was read
    attrs: list[WorkerAttr] = dataclasses.field(default_factory=list)
    datasets: list[str] = dataclasses.field(default_factory=list)  # their Datasets' classes
    seqs: list[int] = dataclasses.field(default_factory=list)  # the requests they answered


#: The censuses of two checks, the earlier first: what an attribution diffs.
CensusPair = tuple[CensusRecord, CensusRecord]


class Evidence(Protocol):
    """What the analyzer may learn about the live process, and nothing else (a port).

    The analyzer calls :meth:`object_count` and :meth:`census` when it decides a census is worth
    its cost; the rules call the others. Every method may be slow (it walks the heap or reads
    ``/proc``) and runs at checks only, never per step.
    """

    def object_count(self, at_most: int | None = None) -> int | None:
        """Objects the garbage collector tracks now (what a census would walk). With
        ``at_most``, a figure at or under it may be a bound, not a count: enough to tell that
        the heap is not larger; and None where telling would take a listing of the heap (a
        census given ``at_most`` finds out with its own listing)."""
        ...

    def census_cost(self) -> float:
        """Seconds a census would take now: objects to walk times the seconds per object the
        censuses of this run measured."""
        ...

    def census(self, *, collect: bool, count_types: bool, epoch: int, step: int,
               rss: float, at_most: int | None = None) -> CensusPair | None:
        """Take a census now and keep it; the censuses of this check and the previous one
        (None until two were taken, or when this one failed). With ``at_most``, a heap of more
        objects is not walked: no census (None), and :meth:`object_count` knows the count."""
        ...

    def attribute(self, metric: str, cur: EpochStats, pair: CensusPair | None,
                  ctx: CheckContext, cfg: AnalyzerConfig, growth: float,
                  trace: Any = None) -> Attribution:
        """What explains ``growth`` bytes of ``metric`` between the two censuses of ``pair``
        (and the allocation sites of ``trace``), and who holds it."""
        ...

    def loaders_with_workers(self) -> tuple[int, Holder | None]:
        """Live DataLoaders whose worker processes run, and the holder of the oldest."""
        ...

    def dataset_bytes(self) -> float | None:
        """What reading the Datasets of the DataLoaders with live workers would write (their
        Python objects' memory, buffers left out); None when no such loader is found."""
        ...

    def mapped_files(self) -> list[tuple[str, float]] | None:
        """The data files mapped now, most resident first: (path, resident bytes); None where
        the system cannot list them (no ``/proc/<pid>/smaps``)."""
        ...

    def worker_growth(self) -> WorkerGrowth | None:
        """What the DataLoader workers' own censuses say grew in their Datasets (answered since
        the previous check), and ask for the next; None where workers answer no census."""
        ...

    def alloc_conf(self) -> str:
        """The device allocator's configuration (``PYTORCH_CUDA_ALLOC_CONF``)."""
        ...

    def holder_size(self, path: str) -> HolderSize | None:
        """The holder an earlier attribution named ``path``, measured again now (its items
        and its own bound); None when it is gone or cannot be measured."""
        ...
