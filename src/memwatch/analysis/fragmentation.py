"""Fragmentation: the caching allocator's reserved-but-unallocated memory grows while allocated
memory does not (or split blocks and allocator retries pile up)."""

from __future__ import annotations

import numpy as np

from memwatch.analysis import explain
from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.shapes import EpochStats, delta, last_value, unit_of
from memwatch.analysis.trend import diff_noise, trend_test
from memwatch.core.findings import Finding
from memwatch.timeline import EpochSummary

__all__ = ["judge"]


def judge(summary: EpochSummary, history: dict[str, list[EpochStats]], ctx: CheckContext,
          cfg: AnalyzerConfig) -> list[Finding]:
    keys = summary.keys
    if "device.reserved" not in keys or "device.allocated" not in keys \
            or summary.bucket_last is None or summary.bucket_step is None:
        return []
    r = summary.bucket_last[:, keys.index("device.reserved")]
    a = summary.bucket_last[:, keys.index("device.allocated")]
    ok = ~(np.isnan(r) | np.isnan(a))
    if ok.sum() < 8:
        return []
    t = summary.bucket_step[ok].astype(np.float64)
    gap = (r - a)[ok]
    if "device.private_pools" in keys:
        # Private pools (CUDA graphs, torch.compile "reduce-overhead") reserve memory for the
        # graphs' own use: reserved but not allocated, and not fragments.
        pp = summary.bucket_last[:, keys.index("device.private_pools")][ok]
        gap = gap - np.nan_to_num(pp)
    alloc_hist = history.get("device.allocated", [])
    alloc = alloc_hist[-1] if alloc_hist and alloc_hist[-1].unit == unit_of(summary) else None
    if alloc is not None and alloc.shape == "growing":
        return []  # reserved follows a growing allocation: that is the leak, not fragments
    tr = trend_test(t, gap)
    total = ctx.limit("device.reserved") or float(np.nanmax(r))
    rise = float(gap[-max(2, len(gap) // 10):].min() - gap[: max(2, len(gap) // 10)].min())
    retries = delta(summary, "device.alloc_retries")
    split = last_value(summary, "device.inactive_split") or 0.0
    reserved_now = last_value(summary, "device.reserved") or 0.0
    thr = max(cfg.shape.min_growth_bytes, 0.01 * reserved_now,
              cfg.shape.noise_k * diff_noise(gap))
    grows = tr.increasing(cfg.shape.alpha) and rise > thr
    heavy = reserved_now > 0 and split > 0.3 * reserved_now and retries > 0
    if not (grows or heavy):
        return []
    return [explain.fragmentation(ctx.origin, gap_now=float(gap[-1]), gap_rise=rise,
                                  slope=tr.slope, split=split, retries=retries,
                                  reserved=reserved_now, total=total)]
