"""Fragmentation: the caching allocator's reserved-but-unallocated memory grows while allocated
memory does not (or split blocks and allocator retries pile up).

With ``expandable_segments:True`` a growing gap is not reported by itself: the allocator maps
and unmaps that memory in pages, so a request that finds no free block unmaps the cached pages
and maps new ones instead of failing. The harm fragmentation does there is the allocator's
retry (it frees its whole cache and tries again, a stall), which ``num_alloc_retries`` counts:
with expandable segments the finding needs a retry in the window. Measured on an H100 (torch
2.11, docs/gpu-verification.md): the same loop of varying sizes grows the gap with and without
expandable segments, and neither retries on an 80 GiB device.
"""

from __future__ import annotations

import numpy as np

from memwatch.analysis.rules.base import Rule, RuleInput
from memwatch.analysis.stats.shapes import delta, last_value, unit_of
from memwatch.analysis.stats.trend import diff_noise, trend_test
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes

__all__ = ["NAME", "RULE", "judge"]

NAME = "fragmentation"


def judge(inp: RuleInput) -> list[Finding]:
    """Fragmentation of the device's caching allocator at this check."""
    summary, history, ctx, cfg = inp.summary, inp.history, inp.ctx, inp.cfg
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
    tail = max(2, len(gap) // 10)
    rise = float(gap[-tail:].min() - gap[:tail].min())
    retries = delta(summary, "device.alloc_retries")
    split = last_value(summary, "device.inactive_split") or 0.0
    reserved_now = last_value(summary, "device.reserved") or 0.0
    thr = max(cfg.shape.min_growth_bytes, 0.01 * reserved_now,
              cfg.shape.noise_k * diff_noise(gap))
    # While the working set itself rises in the window, the allocator is filling its cache:
    # reserved grows with it and the blocks freed between steps are cached, not fragments (an
    # H200 run's first epoch: allocated 3 -> 200 MiB, the gap 10 -> 130 MiB, flat after).
    ak = a[ok]
    warming = float(ak[-tail:].min() - ak[:tail].min()) > thr
    grows = tr.increasing(cfg.shape.alpha) and rise > thr and not warming
    heavy = reserved_now > 0 and split > 0.3 * reserved_now and retries > 0
    conf = inp.evidence.alloc_conf()
    if not (grows or heavy) or ("expandable_segments:True" in conf and retries <= 0):
        return []
    return [fragmentation(ctx.origin, gap_now=float(gap[-1]), gap_rise=rise, slope=tr.slope,
                          split=split, retries=retries, reserved=reserved_now, total=total,
                          conf=conf)]


def fragmentation(origin: Origin, *, gap_now: float, gap_rise: float, slope: float,
                  split: float, retries: float, reserved: float, total: float,
                  conf: str = "") -> Finding:
    severity: Severity = "warning" if retries > 0 or gap_now > 0.25 * total else "info"
    msg = (
        f"The caching allocator holds {fmt_bytes(gap_now)} reserved but unallocated "
        f"(it grew by {fmt_bytes(gap_rise)} this epoch) while allocated memory did not grow: "
        "fragmentation."
    )
    if split > 0:
        msg += f" {fmt_bytes(split)} sit in split blocks that cannot serve larger requests."
    if retries > 0:
        msg += (f" The allocator had to free its cache and retry {int(retries)} time(s) this "
                "epoch, which stalls the step each time.")
    sugg = []
    if "expandable_segments:True" not in conf:
        sugg.append("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (before CUDA "
                    "initialises): segments grow in place instead of fragmenting.")
    sugg += [
        "Keep tensor shapes stable between steps (pad variable-length batches to a few bucket "
        "sizes); changing shapes splinter the cache.",
        "If phases alternate (train/eval), `torch.cuda.empty_cache()` between them returns "
        "unused segments.",
    ]
    return origin.finding(rule=NAME, kind="fragmentation", metric="device.reserved",
                          severity=severity, message=msg, bytes_per_step=slope, suggestions=sugg,
                          evidence={"reserved_minus_allocated": gap_now, "rise": gap_rise,
                                    "inactive_split_bytes": split, "alloc_retries": retries,
                                    "reserved": reserved, "total": total,
                                    "alloc_conf": conf or None})


RULE: Rule[RuleInput] = Rule(
    name=NAME, kinds=frozenset({"fragmentation"}), once=frozenset(), judge=judge,
    reads=("device.reserved", "device.allocated", "device.private_pools",
           "device.inactive_split", "device.alloc_retries"))
