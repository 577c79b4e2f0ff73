"""Leaks: memory that is still held across epoch boundaries and keeps growing.

A *leak* needs the epoch to be growing **and** the previous epoch's rise to still be held: the
floor of this epoch sits above the floor of the previous one by at least a share of what the
previous epoch gained. Growth released at the epoch end is *accumulation*; growth that levels off
is a *plateau*; a single jump is a *step change*. Floors that rise epoch after epoch by similar
amounts are a leak too, even when no single epoch shows a significant trend. On the host, a leak
needs live objects that explain it; growth they do not explain is *allocator retention*, and
growth that is mostly pages of mapped files is *mapped_file* (:mod:`.mapped`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from memwatch.analysis import explain, mapped
from memwatch.analysis.attribution import (
    CensusRecord,
    attribute,
    attribute_traced,
    traced_explains,
)
from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.forecast import consequence, forecast, remaining_steps
from memwatch.analysis.shapes import EpochStats
from memwatch.core.findings import Finding
from memwatch.timeline import EpochSummary

__all__ = ["Once", "judge", "verdict"]

log = logging.getLogger("memwatch")

#: Report a finding of (metric, kind) only the first time: ``once(metric, kind, finding)``.
Once = Callable[[str, str, Finding], list[Finding]]


def verdict(hist: list[EpochStats], cfg: AnalyzerConfig) -> str:
    """'leak', 'accumulation', 'decelerating', 'pending' or 'none' for the latest epoch."""
    cur = hist[-1]
    prev = hist[-2] if len(hist) >= 2 else None
    if prev is not None:
        prev_gain = max(prev.rise, prev.growth if prev.shape == "growing" else 0.0)
        held = cur.floor - prev.floor
        # The previous unit rose, and this one still holds (most of) that rise.
        carried = prev_gain > prev.threshold and held >= cfg.carry_fraction * prev_gain
    if cur.shape == "growing":
        if prev is None:
            return "pending"  # one epoch cannot tell a leak from epoch-scoped accumulation
        # A saturating curve (a cache filling, pools settling) keeps growing, only slower every
        # epoch: a leak keeps its rate.
        decelerating = prev.shape == "growing" and \
            cur.trend.slope_high < cfg.deceleration * prev.slope
        if carried and held > cur.threshold * 0.5 and not decelerating:
            return "leak"
        if decelerating:
            return "decelerating"
        if prev_gain > prev.threshold and held < 0.25 * prev_gain:
            return "accumulation"
        return "pending"
    if cur.shape == "step" and prev is not None and prev.shape == "growing":
        # A steady rise, held, then a stair of the same order: RSS of a leaking process often
        # stalls while the allocator hands out memory it already had (freed by earlier code),
        # then jumps when that runs out. Two units in a row added held memory of similar size.
        if carried and cur.rise > cur.threshold and cur.rise >= 0.4 * prev_gain:
            return "leak"
    # Slow or stair-like leaks: RSS often rises in jumps (the C allocator fills its free pools
    # first, then grows the heap), so no single epoch shows a steady trend; the epoch floors
    # still climb, epoch after epoch, by similar amounts.
    if len(hist) >= 3 and cur.shape in ("flat", "growing", "step"):
        floors = np.array([h.floor for h in hist[-3:]])
        inc = np.diff(floors)
        thr = max(h.threshold for h in hist[-3:])
        if (inc > thr).all() and inc[-1] >= 0.4 * inc[0]:
            return "leak"
    return "none"


def judge(metric: str, summary: EpochSummary, history: dict[str, list[EpochStats]],
          pair: tuple[CensusRecord, CensusRecord] | None, ctx: CheckContext,
          cfg: AnalyzerConfig, once: Once) -> list[Finding]:
    """The verdict on one host or device metric at this check."""
    hist = history[metric]
    cur = hist[-1]
    prev = hist[-2] if len(hist) >= 2 else None
    v = verdict(hist, cfg)
    if v == "leak" and metric == "host.rss":
        found = mapped.judge(history, ctx, cfg)
        if found is not None:  # mostly pages of mapped files: the other parts on their own
            parts = mapped.parts_history(history)
            out = mapped.one_per_culprit([
                f for part in mapped.PARTS if part in parts and verdict(parts[part], cfg) == "leak"
                for f in judge(part, summary, parts, pair, ctx, cfg, once)])
            if not out and pair is not None:
                # The parts, read in the background, may not show a trend yet (a few reads a
                # unit) while the census already names live objects that explain the rest:
                # library code pages faulted in by the first steps are file-backed too, and
                # must not delay a leak the census has evidence for.
                f = _leak_finding(metric, summary, hist, history, pair, None, ctx, cfg)
                if f is not None and f.kind == "leak" and f.culprit:
                    out = [f]
            return once(metric, "mapped_file", found) + out
    trace = ctx.trace if metric.startswith("host.") else None  # tracemalloc sees the host only
    if v == "leak" and metric.startswith("host.") and pair is None and \
            ctx.census != "never" and not traced_explains(trace, cfg):
        # Host growth without a census at two epoch ends cannot be told apart from native
        # start-up growth or allocator retention: this epoch's census was just taken, so the
        # verdict (with its culprit) comes at the next epoch end. (Unless live traced Python
        # allocations grew by as much: that is user code, named by its allocation site.)
        return []
    if v == "leak":
        f = _leak_finding(metric, summary, hist, history, pair, trace, ctx, cfg)
        return [f] if f is not None else []
    if v == "accumulation":
        return once(metric, "accumulation", explain.accumulation(ctx.origin, metric, cur, prev))
    if (cur.shape == "plateau" or v == "decelerating") and \
            worth_reporting(cur, max(cur.rise, cur.growth), cfg):
        return once(metric, "plateau", explain.plateau(ctx.origin, metric, cur))
    if cur.shape == "step" and len(hist) > 1 and worth_reporting(cur, cur.step_height, cfg):
        # (a jump in the first epoch is warm-up: optimizer state, lazy initialisation)
        return [explain.step_change(ctx.origin, metric, cur)]
    return []


def worth_reporting(cur: EpochStats, amount: float, cfg: AnalyzerConfig) -> bool:
    """Informational findings only for changes a person would care about."""
    return amount >= max(cfg.shape.min_growth_bytes, cfg.info_min_rel * abs(cur.level))


def _leak_finding(metric: str, summary: EpochSummary, hist: list[EpochStats],
                  history: dict[str, list[EpochStats]],
                  pair: tuple[CensusRecord, CensusRecord] | None, trace: Any,
                  ctx: CheckContext, cfg: AnalyzerConfig) -> Finding | None:
    cur = hist[-1]
    slope = cur.slope
    low, high = cur.trend.slope_low, cur.trend.slope_high
    if cur.shape != "growing" and len(hist) >= 2:
        # Cross-epoch leak: the rate from the epoch floors.
        steps = sum(h.n_steps for h in hist[-3:])
        slope = (hist[-1].floor - hist[-3 if len(hist) >= 3 else -2].floor) / max(steps, 1)
        low, high = slope * 0.5, slope * 1.5
    limit = ctx.limit(metric)
    peak_now, steps_to_oom = forecast(metric, summary, cur, slope, limit, history)
    seconds_to_oom = None if steps_to_oom is None else steps_to_oom * cur.seconds_per_step
    severity = consequence(steps_to_oom, cur, ctx, cfg)
    # What live objects must explain: the growth over the stretch between the two censuses,
    # at the judged rate (floors), never two point reads of RSS (a busy machine moves those).
    census_steps = pair[1].step - pair[0].step if pair is not None else cur.n_steps
    attribution = attribute(metric, cur, pair, ctx, cfg,
                            growth=max(slope, 0.0) * max(census_steps, 1))
    if trace is not None:
        attribute_traced(attribution, cur, trace, cfg)
    if attribution.own_growth:
        # memwatch's own tracing bookkeeping: nothing of the user's to report.
        log.debug("memwatch: %s grew by %s, memwatch's own while tracing; no finding",
                  metric, attribution.tracemalloc_summary)
        return None
    if attribution.retention and metric.startswith("host.rss"):
        return explain.allocator_retention(ctx.origin, metric, slope, attribution)
    return explain.leak(origin=ctx.origin, metric=metric, stats=hist, slope=slope,
                        slope_ci=(low, high), limit=limit, peak_now=peak_now,
                        steps_to_oom=steps_to_oom, seconds_to_oom=seconds_to_oom,
                        severity=severity, attribution=attribution,
                        remaining=remaining_steps(cur, ctx), run_known=bool(ctx.total_steps))
