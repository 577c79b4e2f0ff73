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
        group: the growing group of live tensors named as the culprit (largest effective
            growth, preferring one whose holder could be named).
        holder: who keeps one of that group's new objects alive.
        graph_bytes: saved-tensor bytes the group's autograd graph holds per tensor.
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
                      python_object_growth=self.python_object_growth)
            if self.attribution_ms is not None:
                ev["attribution_ms"] = self.attribution_ms
            if self.group is not None:
                ev["graph_bytes"] = self.graph_bytes
        for name in ("explained_bytes", "rss_growth_bytes", "tracemalloc",
                     "tracemalloc_summary"):
            v = getattr(self, name)
            if v is not None:
                ev[name] = v
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
    dev_prefix = "cpu" if metric.startswith("host.") else ctx.device_prefix
    growths = census_mod.diff(prev.census, rec.census, dev_prefix)
    types = census_mod.type_growth(prev.census, rec.census)
    out = Attribution(
        census_ms=round(rec.census.elapsed_ms, 1),
        objects_scanned=rec.census.objects,
        tensors_scanned=rec.census.tensors,
        census_epochs=[prev.epoch, rec.epoch],
        growing_groups=[{**g.group.to_dict(), "count_delta": g.count_delta,
                         "bytes_delta": g.bytes_delta} for g in growths[:8]],
        python_object_growth=types,
    )
    # Candidates: the largest growth by bytes, plus groups with autograd history (a scalar loss
    # kept with its graph is tiny itself but holds the graph's saved activations).
    cands = growths[:6] + [g for g in growths[6:] if g.group.grad_fn][:4]
    wanted = {}
    for g in cands:
        ids = g.new_ids or g.group.ids
        if ids:
            wanted[id(g)] = ids[len(ids) // 2]
    objs = holders_mod.objects_by_ids(set(wanted.values()))
    scored = []
    obj = None
    for g in cands:
        obj = objs.get(wanted.get(id(g), -1))
        gb = 0
        if obj is not None and g.group.grad_fn:
            gb, _ = census_mod.graph_bytes(obj)
        scored.append((g.bytes_delta + gb * max(g.count_delta, 0), g, gb))
    del obj
    scored.sort(key=lambda x: x[0], reverse=True)
    deadline = time.perf_counter() + cfg.holder_budget_s
    for eff, g, gb in scored:
        if time.perf_counter() > deadline:
            break
        # Out of the dict before the walk: a container of ours must not be reported as the
        # holder (our frames are skipped, our dicts would not be).
        target = objs.pop(wanted.get(id(g), -1), None)
        if target is None or (g.count_delta <= 0 and g.bytes_delta <= 0):
            continue
        holder = holders_mod.holder_of(target,
                                       budget_s=max(deadline - time.perf_counter(), 0.1))
        del target
        if holder is None:
            continue
        out.holder, out.group, out.graph_bytes, out.effective_bytes = holder, g, gb, eff
        break
    del objs
    if out.holder is None and scored:
        out.effective_bytes, out.group, out.graph_bytes = scored[0]
    out.attribution_ms = round((time.perf_counter() - t0) * 1000.0, 1)
    # Host growth that no live tensor or Python object explains: the allocator kept it. The
    # growth is the judged one (floors, over the stretch between the censuses): two point reads
    # of RSS at the census moments would let a busy machine decide the verdict.
    if metric.startswith("host.rss"):  # host.rss, or its anonymous / shared-memory part
        rss_growth = growth
        tensor_growth = sum(max(e, 0) for e, _, _ in scored)
        obj_growth = 64 * sum(d for _, d in types)
        explained = tensor_growth + obj_growth
        out.explained_bytes = explained
        out.rss_growth_bytes = rss_growth
        # Even when some small growing group has a holder, it is not *the* leak if it explains
        # only a sliver of the growth: native start-up growth and the C allocator's retention
        # look like this ... unless a named holder gains about one object per step or more:
        # something appended every step in user code is a leak even when its bytes are
        # invisible (a loss kept after backward() holds native autograd nodes, not tensors).
        steps = max(rec.step - prev.step, 1) if rec.step > prev.step else max(cur.n_steps, 1)
        per_step = out.holder is not None and out.group is not None and \
            out.group.count_delta >= 0.5 * steps
        if rss_growth > 0 and not per_step and explained < cfg.retention_explained * rss_growth:
            out.retention = True
    return out


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
    if not d.growths or out.holder is not None:
        return
    top = d.growths[0]
    rss = d.explainable_rss_growth()
    big = rss is None or rss <= 0 or top.bytes_delta >= 0.1 * rss
    # A block kept every step at a line of user code names it even when the bytes are elsewhere
    # (a tensor's storage is not a traced Python allocation, its object is).
    per_step = top.user and top.count_delta >= 0.5 * max(steps, 1)
    if (explains and big) or per_step:
        out.site = top
