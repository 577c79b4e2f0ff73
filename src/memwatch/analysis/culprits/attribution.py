"""Attribution: from the growth of a metric to the objects that explain it, and who holds them:
the stages of :mod:`memwatch.analysis.culprits` run for one growth.

Two censuses of live objects taken at two checks (:mod:`.census.census`) are diffed; the groups
that grew are ranked by the bytes they hold (a tensor with autograd history counts the saved
tensors of its graph too; grown containers are weighed, :mod:`.growth.weigh`), and for the first
candidates a bounded walk names the holder (:mod:`.holders.holders`). On the host, growth that no
live object explains is allocator retention, not a leak. With tracing on, allocation sites
(:mod:`.census.allocations`, judged by :mod:`.growth.traced`) add what the census cannot see.

The result is one typed :class:`~memwatch.analysis.evidence.Attribution` record, which
the culprit wording (:mod:`.wording`) and the finding's evidence are built from.
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Any

from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.culprits.census import census as census_mod
from memwatch.analysis.culprits.census.containers import container_growth
from memwatch.analysis.culprits.growth import device_sites, weigh
from memwatch.analysis.culprits.holders import holders as holders_mod
from memwatch.analysis.culprits.holders.untracked import ArrayBases
from memwatch.analysis.evidence import Attribution, CensusPair, GroupGrowth
from memwatch.analysis.evidence import ContainerGrowth as _Container
from memwatch.analysis.stats.shapes import EpochStats

__all__ = ["alloc_sites_of", "attribute"]


def attribute(metric: str, cur: EpochStats, pair: CensusPair | None,
              ctx: CheckContext, cfg: AnalyzerConfig, growth: float = 0.0) -> Attribution:
    """Diff the two censuses of ``pair`` for ``metric``'s growth (``growth`` bytes over the
    stretch between them, at the judged rate) and name its holder."""
    if pair is None:
        why = "turned off (census='never')" if ctx.census == "never" else \
            "not taken at two checks yet"
        return Attribution(census_note=why)
    prev, rec = pair
    t0 = time.perf_counter()
    host = metric.startswith("host.")
    dev_prefix = "cpu" if host else ctx.device_prefix
    growths = census_mod.diff(prev.census, rec.census, dev_prefix)
    types = census_mod.type_growth(prev.census, rec.census)
    out = Attribution(
        census_steps=max(rec.step - prev.step, 0),
        census_ms=round(rec.census.elapsed_ms, 1),
        objects_scanned=rec.census.objects,
        tensors_scanned=rec.census.tensors,
        census_epochs=[prev.epoch, rec.epoch],
        census_at_steps=[prev.step, rec.step],
        unit_from_step=max(ctx.steps_done - cur.n_steps, 0),
        growing_groups=[{**g.group.to_dict(), "count_delta": g.count_delta,
                         "bytes_delta": g.bytes_delta, "graph_nodes_delta": g.graph_nodes_delta,
                         "graph_bytes_delta": g.graph_bytes_delta} for g in growths[:8]],
        python_object_growth=types,
        graph_nodes=rec.census.graph_nodes,
    )
    # The owners: containers that were there at the previous census and grew since. A leak
    # needs the same owner growing across checks; a container made anew since then (an index
    # permutation a sampler rebuilds every epoch, a per-step dict inside a growing log) is at
    # most part of an owner's growth, never an owner itself.
    grown = [g for g in container_growth(prev.census.containers, rec.census.containers)
             if not g.new] if host else []
    owners = {g.obj_id: g.len_delta for g in grown}
    # Candidates: growing tensor groups (storages and autograd graphs, by bytes; a scalar loss
    # kept with its graph is tiny itself but holds the graph), and the owners, weighed.
    cands: list[_Candidate] = []
    for g in growths[:6] + [g for g in growths[6:] if g.graph_nodes_delta > 0][:4]:
        ids = g.new_ids or g.group.ids
        if ids:
            mid = ids[len(ids) // 2]
            cands.append(_Candidate(float(g.effective_bytes), mid, group=g,
                                    others=tuple(dict.fromkeys(i for i in (ids[0], ids[-1])
                                                               if i != mid))))
    objs = weigh.objects_for({c.target for c in cands} | {i for c in cands for i in c.others}
                             | {g.obj_id for g in grown[:12]}
                             | {i for c in cands if c.group is not None
                                and c.group.graph_nodes_delta > 0
                                for i in _graph_sample(c.group)})
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
    for c in cands:
        if c.group is not None and c.group.graph_nodes_delta > 0:
            # The tensor whose graph grows is the one to name, not any of its group (the
            # current step's loss and the accumulator a step's graph is chained onto can be
            # the same kind of tensor): the one with the largest graph now.
            c.target, c.graph_nodes = _largest_graph(c.group, objs)
    out.containers = [c.container.to_dict() for c in cands if c.container is not None]
    cands.sort(key=lambda c: c.bytes, reverse=True)
    # A container of tensors and the tensor group it gained are one growth seen twice: walk from
    # the tensors (their group says dtype, shape and autograd history; the walk still names the
    # container, with its size).
    group_bytes = max((c.bytes for c in cands if c.group is not None), default=0.0)
    walk_order = [c for c in cands if not (c.container is not None and
                  c.container.element == "tensors" and group_bytes >= 0.5 * c.bytes)]
    # A growing autograd graph first: its largest-graph tensor is the root that keeps the
    # chain, and the tensors of other groups saved in that graph (activations) have no holder
    # a walk can see: walking from them first spends the budget on dead ends. Only a graph
    # that is a real part of the growth: the step in progress keeps its own loss and graph
    # alive at the census (a few KiB), which must not outrank a list that gained megabytes.
    big = max((c.bytes for c in walk_order), default=0.0)
    walk_order.sort(key=lambda c: not (c.graph_nodes > 0 and c.bytes >= 0.5 * big))
    # CPU seconds of this thread, as in every walk (:class:`.referrers.ReferrerGraph`).
    deadline = time.thread_time() + cfg.holder_budget_s
    arrays = ArrayBases(budget_s=cfg.holder_budget_s / 2)
    reasons: dict[int, str] = {}  # id(candidate) -> why its walk named nothing
    try:
        for c in walk_order:
            if time.thread_time() > deadline or c.bytes <= 0:
                break
            holder = None
            for i in (c.target, *c.others):
                # Out of the dict before the walk: a container of ours must not be reported as
                # the holder (our frames are skipped, our dicts would not be).
                target = objs.pop(i, None)
                if target is None:
                    continue
                # (``objs`` still holds the other candidates, a container among them: not a
                # holder)
                holder, reasons[id(c)] = holders_mod.walk(
                    target, budget_s=max(deadline - time.thread_time(), 0.1),
                    ignore=(id(objs), id(owners), id(reasons)), owners=owners, arrays=arrays)
                del target
                # Another of the group only where this one has no Python referrer at all (a
                # parameter's ``.grad``, held in C++, in a group with Adam's moments): it says
                # nothing of who keeps the rest.
                if holder is not None or reasons[id(c)] != holders_mod.NO_REFERRER:
                    break
            if holder is None:
                continue
            out.holder = holder
            out.chosen = c
            break
    finally:
        arrays.close()
        objs.clear()
    # What only memwatch's own objects keep is never a culprit (nor explains anything).
    own = {i for i, w in reasons.items() if w == holders_mod.OWN}
    cands = [c for c in cands if id(c) not in own]
    walk_order = [c for c in walk_order if id(c) not in own]
    if out.chosen is None and walk_order:
        out.chosen = walk_order[0]
        out.holder_note = _NO_HOLDER.get(reasons.get(id(out.chosen), ""), _NO_HOLDER[""])
    if out.chosen is not None:
        out.group, out.container = out.chosen.group, out.chosen.container
        out.effective_bytes = out.chosen.bytes
        if out.group is not None:
            out.graph_bytes = out.group.graph_bytes_delta
            out.graph_saved_bytes = max(out.group.graph_saved_delta, 0)
            out.graph_nodes_named = out.chosen.graph_nodes
    if not host and out.group is not None and ctx.device_snapshot is not None:
        out.alloc_sites = alloc_sites_of(out.group, ctx)
    out.attribution_ms = round((time.perf_counter() - t0) * 1000.0, 1)
    # Host growth that no live tensor or Python object explains: the allocator kept it. The
    # growth is the judged one (floors, over the stretch between the censuses): two point reads
    # of RSS at the census moments would let a busy machine decide the verdict.
    if metric.startswith("host.rss"):  # host.rss, or its anonymous / shared-memory part
        rss_growth = growth
        # The groups that gained, each by its own shape; never more than live tensors added in
        # all (a cache at its bound replacing entries of one shape with another's gains in some
        # groups what it loses in others: that rotation explains no growth).
        tensor_growth = min(sum(max(c.bytes, 0) for c in cands if c.group is not None),
                            max(census_mod.net_growth(prev.census, rec.census, dev_prefix), 0))
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
        # step is no explanation for kilobytes a step. Nor for autograd nodes: their bytes are
        # counted, and the graph of the step in progress, alive at the census, is a few dozen
        # to a few hundred nodes whatever the interval: with checks every 16 steps it would
        # pass for one node a step.)
        per_step = out.holder is not None and out.group is not None and \
            out.group.count_delta >= 0.5 * steps
        # A graph walk cut at its node budget no longer sees the graph grow: no verdict of
        # retention on a census that could not see it.
        cut = rec.census.graph_truncated
        if rss_growth > 0 and not per_step and not cut and \
                explained < cfg.retention_explained * rss_growth:
            out.retention = True
    return out


def alloc_sites_of(g: GroupGrowth, ctx: CheckContext) -> list[Any]:
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


#: Why no holder was named, in words (by :func:`.holders.holders.walk`'s reason).
_NO_HOLDER = {
    holders_mod.NO_REFERRER: "nothing in Python refers to these objects: they are held from "
                             "native code (an autograd graph's saved tensors, a C extension's "
                             "buffers), where a walk up the references cannot follow",
    holders_mod.CUT: "the walk up the references ran out of its budget before it reached a "
                     "name (`AnalyzerConfig.holder_budget_s`)",
    "": "the walk up the references was not taken (the check's budget for it was spent)",
}


#: Tensors of a graph-growing group whose graphs are measured one by one to name the largest.
_GRAPH_TENSORS = 32


def _graph_sample(g: GroupGrowth) -> list[int]:
    """The group's tensors whose graphs are measured: the first and the last of those the
    census recorded, and the newest. The tensor that holds a growing chain (an RNN's carried
    hidden state) is the newest of its kind, which the collector may list anywhere."""
    ids, half = g.group.ids, _GRAPH_TENSORS // 2
    picked = dict.fromkeys([*ids[:half], *ids[-half:], *g.new_ids[-half:]])
    return list(picked)


def _held_from_python(ids: list[int], ignore: set[int], limit: int = 8) -> list[int]:
    """Tensors of a group that a Python object refers to (a dict, a list, a frame): the roots a
    growing chain hangs from. Tensors saved inside an autograd graph have no such referrer
    (autograd holds them from C++). One pass over the collector's objects for the group, one
    for their referrers: taken only for a group whose graph grows."""
    import gc

    found = weigh.objects_for(set(ids))
    tensors = list(found.values())
    found.clear()
    if not tensors:
        return []
    wanted = {id(t) for t in tensors}
    mine = {id(tensors), id(wanted), *ignore}
    out: list[int] = []
    try:
        for r in gc.get_referrers(*tensors):
            if id(r) in mine or not isinstance(r, (dict, list, tuple, types.FrameType)):
                continue
            for x in gc.get_referents(r):
                if id(x) in wanted and id(x) not in out:
                    out.append(id(x))
            if len(out) >= limit:
                break
    finally:
        tensors.clear()
    return out


def _largest_graph(g: GroupGrowth, objs: dict[int, Any]) -> tuple[int, int]:
    """(id, nodes) of the tensor of ``g`` with the largest autograd graph (of those found)."""
    from memwatch.analysis.culprits.census.graphs import graph_size

    best, nodes = (g.new_ids or g.group.ids)[0], -1
    ids = [*_graph_sample(g), *_held_from_python(g.group.ids, ignore={id(objs)})]
    missing = {i for i in ids if i not in objs}
    if missing:
        objs.update(weigh.objects_for(missing))  # the walk starts from the objects found here
    for i in ids:
        t = objs.get(i)
        if t is None:
            continue
        _, n = graph_size(t, max_nodes=50_000)
        if n > nodes:
            best, nodes = i, n
    return best, max(nodes, 0)


@dataclasses.dataclass
class _Candidate:
    """Something that grew between two censuses, its growth in bytes and an object to walk
    from to name who holds it."""

    bytes: float
    target: int  # id of the object the holder walk starts from
    group: GroupGrowth | None = None
    container: _Container | None = None
    graph_nodes: int = 0  # nodes of the named tensor's autograd graph (graph growth)
    #: Other objects of the group to walk from, where the target has no Python referrer.
    others: tuple[int, ...] = ()

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
