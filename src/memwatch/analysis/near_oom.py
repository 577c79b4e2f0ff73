"""Near-OOM: an epoch whose peak came within a margin of the known limit."""

from __future__ import annotations

import math

from memwatch.analysis import explain
from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.core.findings import Finding
from memwatch.timeline import EpochSummary

__all__ = ["judge"]


def judge(summary: EpochSummary, ctx: CheckContext, cfg: AnalyzerConfig) -> list[Finding]:
    out = []
    margin = cfg.near_oom_margin
    for metric in ("device.peak", "device.reserved", "host.rss", "cgroup.working_set"):
        if metric not in summary.keys:
            continue
        limit = ctx.limit(metric)
        peak = float(summary.peak[summary.keys.index(metric)])
        if limit is None or math.isnan(peak) or peak < (1 - margin) * limit:
            continue
        out.append(explain.near_oom(ctx.origin, metric, peak, limit, margin))
        if metric.startswith("device."):
            break  # one device finding is enough
    return out
