"""Allocation-site evidence (``MemWatch(tracemalloc=...)``) weighed against a host growth: do live
traced Python allocations explain it (user code keeps them: a leak), and which site names the
culprit when no holder of tensors was named. Pure functions of an allocation diff
(:class:`memwatch.analysis.culprits.census.sites.AllocationDiff`) and an attribution.
"""

from __future__ import annotations

from typing import Any

from memwatch.analysis.context import AnalyzerConfig
from memwatch.analysis.evidence import Attribution
from memwatch.analysis.stats.shapes import EpochStats

__all__ = ["attribute_traced", "traced_explains"]


def traced_explains(d: Any, cfg: AnalyzerConfig) -> bool:
    """Live traced Python allocations grew by a fair share of the host growth: user code keeps
    them (a leak), the allocator does not (retention)."""
    return d is not None and bool(d.explains(cfg.shape.min_growth_bytes,
                                             cfg.retention_explained))


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
