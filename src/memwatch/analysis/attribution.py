"""Attribution: from the growth of a metric to the objects that explain it, and who holds them.

Two censuses of live objects taken at two checks (:mod:`memwatch.analysis.census`) are diffed;
the groups that grew are ranked by the bytes they hold (a tensor with autograd history counts the
saved tensors of its graph too), and for the first candidates a bounded walk names the holder
(:mod:`memwatch.analysis.holders`). On the host, growth that no live object explains is allocator
retention, not a leak. With tracing on, allocation sites (:mod:`memwatch.analysis.allocations`)
add what the census cannot see.

The result is one typed :class:`Attribution` record, which the messages
(:mod:`memwatch.analysis.explain`) and the finding's evidence are built from.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from memwatch.analysis import census as census_mod
from memwatch.analysis import device_sites, weigh
from memwatch.analysis import holders as holders_mod
from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.shapes import EpochStats

__all__ = ["Attribution", "CensusRecord", "attribute", "attribute_traced", "traced_explains"]


@dataclasses.dataclass
class CensusRecord:
    """A census taken at one check, with the process's RSS at that check."""

    epoch: int
    census: census_mod.Census
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
    growing_groups: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    python_object_growth: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    group: census_mod.GroupGrowth | None = None
    container: weigh.ContainerGrowth | None = None
    chosen: Any = None  # the candidate named (group or container)
    containers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    graph_nodes: int = 0
    alloc_sites: list[Any] = dataclasses.field(default_factory=list)  # device_sites.AllocSite
    holder: holders_mod.Holder | None = None
    graph_bytes: int = 0
    effective_bytes: float = 0.0
    attribution_ms: float | None = None
    explained_bytes: float | None = None
    rss_growth_bytes: float | None = None
    retention: bool = False
    own_growth: bool = False
    tracemalloc: list[dict[str, Any]] | None = None
    tracemalloc_summary: dict[str, Any] | None = None
    site: Any = None  # sites.SiteGrowth

    def evidence(self) -> dict[str, Any]:
        """The keys a finding's evidence carries about its attribution."""
        ev: dict[str, Any] = {}
        if self.census_note is not None:
            ev["census"] = self.census_note
        else:
            ev.update(census_ms=self.census_ms, objects_scanned=self.objects_scanned,
                      tensors_scanned=self.tensors_scanned, census_epochs=self.census_epochs,
                      growing_groups=self.growing_groups,
                      python_object_growth=self.python_object_growth,
                      growing_containers=self.containers[:8], graph_nodes=self.graph_nodes)
            if self.attribution_ms is not None:
                ev["attribution_ms"] = self.attribution_ms
            if self.group is not None:
                ev["graph_bytes"] = self.graph_bytes
                ev["graph_nodes_delta"] = self.group.graph_nodes_delta
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
        return ev


def attribute(metric: str, cur: EpochStats, pair: tuple[CensusRecord, CensusRecord] | None,
              ctx: CheckContext, cfg: AnalyzerConfig, growth: float = 0.0) -> Attribution:
    """Diff the two censuses of ``pair`` for ``metric``'s growth (``growth`` bytes over the
    stretch between them, at the judged rate) and name its holder."""
    if pair is None:
        why = "turned off (census='never')" if ctx.census == "never" else \
            "not taken at two epoch ends yet"
        return Attribution(census_note=why)
    prev, rec = pair
    t0 = time.perf_counter()
    host = metric.startswith("host.")
    dev_prefix = "cpu" if host else ctx.device_prefix
    growths = census_mod.diff(prev.census, rec.census, dev_prefix)
    types = census_mod.type_growth(prev.census, rec.census)
    out = Attribution(
        census_ms=round(rec.census.elapsed_ms, 1),
        objects_scanned=rec.census.objects,
        tensors_scanned=rec.census.tensors,
        census_epochs=[prev.epoch, rec.epoch],
        growing_groups=[{**g.group.to_dict(), "count_delta": g.count_delta,
                         "bytes_delta": g.bytes_delta, "graph_nodes_delta": g.graph_nodes_delta,
                         "graph_bytes_delta": g.graph_bytes_delta} for g in growths[:8]],
        python_object_growth=types,
        graph_nodes=rec.census.graph_nodes,
    )
    # Candidates: growing tensor groups (storages and autograd graphs, by bytes; a scalar loss
    # kept with its graph is tiny itself but holds the graph) and, on the host, containers
    # that grew, weighed.
    cands: list[_Candidate] = []
    for g in growths[:6] + [g for g in growths[6:] if g.graph_nodes_delta > 0][:4]:
        ids = g.new_ids or g.group.ids
        if ids:
            cands.append(_Candidate(float(g.effective_bytes), ids[len(ids) // 2], group=g))
    grown = weigh.container_growth(prev.census.containers, rec.census.containers) \
        if host else []
    objs = weigh.objects_for({c.target for c in cands} | {g.obj_id for g in grown[:12]})
    scale = weigh.Scale()
    try:
        for cg in grown[:12]:
            obj = objs.get(cg.obj_id)
            if obj is not None:
                weigh.weigh_growth(cg, obj, scale)
                cands.append(_Candidate(cg.bytes_delta, cg.obj_id, container=cg))
            del obj
    finally:
        scale.close()
    out.containers = [c.container.to_dict() for c in cands if c.container is not None]
    cands.sort(key=lambda c: c.bytes, reverse=True)
    # A container of tensors and the tensor group it gained are one growth seen twice: walk from
    # the tensors (their group says dtype, shape and autograd history; the walk still names the
    # container, with its size).
    group_bytes = max((c.bytes for c in cands if c.group is not None), default=0.0)
    walk_order = [c for c in cands if not (c.container is not None and
                  c.container.element == "tensors" and group_bytes >= 0.5 * c.bytes)]
    deadline = time.perf_counter() + cfg.holder_budget_s
    for c in walk_order:
        if time.perf_counter() > deadline or c.bytes <= 0:
            break
        # Out of the dict before the walk: a container of ours must not be reported as the
        # holder (our frames are skipped, our dicts would not be).
        target = objs.pop(c.target, None)
        if target is None:
            continue
        # (``objs`` still holds the other candidates, a container among them: not a holder)
        holder = holders_mod.holder_of(target,
                                       budget_s=max(deadline - time.perf_counter(), 0.1),
                                       ignore=(id(objs),))
        del target
        if holder is None:
            continue
        out.holder = holder
        out.chosen = c
        break
    objs.clear()
    if out.chosen is None and walk_order:
        out.chosen = walk_order[0]
    if out.chosen is not None:
        out.group, out.container = out.chosen.group, out.chosen.container
        out.effective_bytes = out.chosen.bytes
        if out.group is not None:
            out.graph_bytes = out.group.graph_bytes_delta
    if not host and out.group is not None and ctx.device_snapshot is not None:
        out.alloc_sites = alloc_sites_of(out.group, ctx)
    out.attribution_ms = round((time.perf_counter() - t0) * 1000.0, 1)
    # Host growth that no live tensor or Python object explains: the allocator kept it. The
    # growth is the judged one (floors, over the stretch between the censuses): two point reads
    # of RSS at the census moments would let a busy machine decide the verdict.
    if metric.startswith("host.rss"):  # host.rss, or its anonymous / shared-memory part
        rss_growth = growth
        tensor_growth = sum(max(c.bytes, 0) for c in cands if c.group is not None)
        object_growth = sum(max(c.bytes, 0) for c in cands if c.container is not None)
        # A container of tensors is weighed by the same bytes its tensor groups grew by: the
        # larger of the two, not their sum.
        explained = max(tensor_growth, object_growth)
        out.explained_bytes = explained
        out.rss_growth_bytes = rss_growth
        # Even when some small growing group has a holder, it is not *the* leak if it explains
        # only a sliver of the growth: native start-up growth and the C allocator's retention
        # look like this ... unless a named holder gains about one object per step or more:
        # something appended every step in user code is a leak even when its bytes are
        # invisible (tensors whose native memory the census cannot see).
        steps = max(rec.step - prev.step, 1) if rec.step > prev.step else max(cur.n_steps, 1)
        # (Not for a weighed container: its bytes are known, a list of floats gaining one a
        # step is no explanation for kilobytes a step.)
        per_step = out.holder is not None and out.group is not None and \
            out.chosen.per_check() >= 0.5 * steps
        # A graph walk cut at its node budget no longer sees the graph grow: no verdict of
        # retention on a census that could not see it.
        cut = rec.census.graph_truncated
        if rss_growth > 0 and not per_step and not cut and \
                explained < cfg.retention_explained * rss_growth:
            out.retention = True
    return out


def alloc_sites_of(g: census_mod.GroupGrowth, ctx: CheckContext) -> list[Any]:
    """Where the group's new device tensors were allocated (the allocator's recorded history)."""
    ids = (g.new_ids or g.group.ids)[:256]
    objs = weigh.objects_for(set(ids))
    try:
        addrs = {int(t.data_ptr()) for t in objs.values() if hasattr(t, "data_ptr")}
    except Exception:  # noqa: BLE001 - an exotic tensor: no addresses, no join
        addrs = set()
    finally:
        objs.clear()
    if not addrs or ctx.device_snapshot is None:
        return []
    try:
        snap = ctx.device_snapshot()
    except Exception:  # noqa: BLE001 - the snapshot is evidence; never fail a check over it
        return []
    return device_sites.join(snap, addrs)


@dataclasses.dataclass
class _Candidate:
    """Something that grew between two censuses, its growth in bytes and an object to walk
    from to name who holds it."""

    bytes: float
    target: int  # id of the object the holder walk starts from
    group: census_mod.GroupGrowth | None = None
    container: weigh.ContainerGrowth | None = None

    def per_check(self) -> int:
        """Objects (elements, tensors, autograd nodes) added since the last census."""
        if self.container is not None:
            return self.container.len_delta
        if self.group is not None:
            return max(self.group.count_delta, self.group.graph_nodes_delta)
        return 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"bytes": self.bytes}
        if self.container is not None:
            d["container"] = self.container.to_dict()
        if self.group is not None:
            d["group"] = self.group.group.describe()
        return d


def traced_explains(d: Any, cfg: AnalyzerConfig) -> bool:
    """Live traced Python allocations grew by a fair share of the host growth: user code keeps
    them (a leak), the allocator does not (retention)."""
    if d is None:
        return False
    grew = min(d.traced_growth, d.traced_net)  # net: what was released elsewhere counts
    if grew <= 0:
        return False
    rss = d.explainable_rss_growth()
    if rss is None or rss <= 0:
        return bool(grew >= cfg.shape.min_growth_bytes)
    return bool(grew >= cfg.retention_explained * rss)


def attribute_traced(out: Attribution, cur: EpochStats, d: Any, cfg: AnalyzerConfig) -> None:
    """Add the allocation sites that grew; they overrule a retention verdict when they explain
    the growth, and name the culprit when no holder of tensors was named."""
    steps = d.steps or cur.n_steps
    out.tracemalloc = [g.to_dict(steps) for g in d.growths[:8]]
    summary = d.summary()
    explains = traced_explains(d, cfg)
    summary["explains_growth"] = explains
    out.tracemalloc_summary = summary
    if explains:
        out.retention = False  # growth of live Python allocations: a leak in user code
    elif out.retention and d.rss_growth is not None and \
            d.rss_growth - d.own_rss_growth <= cur.threshold:
        # What grew is memwatch's own while tracing (the traces, the snapshot's objects the
        # allocator kept): not the user's.
        out.own_growth = True
    if not d.growths or (out.holder is not None and out.container is None):
        return  # a holder of tensors names it; a container's holder is joined to its site
    top = d.growths[0]
    rss = d.explainable_rss_growth()
    big = rss is None or rss <= 0 or top.bytes_delta >= 0.1 * rss
    # A block kept every step at a line of user code names it even when the bytes are elsewhere
    # (a tensor's storage is not a traced Python allocation, its object is).
    per_step = top.user and top.count_delta >= 0.5 * max(steps, 1)
    if (explains and big) or per_step:
        out.site = top
