"""Forecasts: how many steps until a growing metric reaches its limit, and what counts as soon.

The one place the arithmetic lives: :func:`steps_to_limit` for any metric, :func:`forecast` for a
leak of device memory (which must fit under the limit with its reserved cache and per-step peak
too), :func:`consequence` for the severity that follows.

On a device, allocations fail when *reserved* memory (allocated plus the allocator's cache) or
the per-step *peak* reaches capacity, so a leak of allocated memory is extrapolated on each of
them with its own rate, and the earliest crossing wins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Severity
from memwatch.timeline import EpochSummary

__all__ = ["consequence", "forecast", "remaining_steps", "steps_to_limit"]


def steps_to_limit(limit: float | None, peak: float, slope: float) -> float | None:
    """Steps until a metric whose peak is ``peak`` and which grows by ``slope`` bytes per step
    reaches ``limit``: None without a limit or without growth; 0 when the peak is already there.

    Example::

        >>> steps_to_limit(100.0, 60.0, 2.0), steps_to_limit(100.0, 120.0, 2.0)
        (20.0, 0.0)
        >>> steps_to_limit(None, 60.0, 2.0), steps_to_limit(100.0, 60.0, 0.0)
        (None, None)
    """
    if not limit or slope <= 0 or math.isnan(peak):
        return None
    return max(limit - peak, 0.0) / slope


def forecast(metric: str, summary: EpochSummary, cur: EpochStats, slope: float,
             limit: float | None,
             history: Mapping[str, list[EpochStats]]) -> tuple[float, float | None]:
    """(peak used, steps to OOM): the earliest crossing among the metrics that must fit. The
    unit's peak, or its closing reading when that is higher (a boundary's stair on top)."""
    peak_now = cur.peak if cur.closing is None else max(cur.peak, cur.closing)
    best = steps_to_limit(limit, peak_now, slope)
    if best is None:
        return peak_now, None
    if metric == "device.allocated":
        for k in ("device.peak", "device.reserved"):
            h = history.get(k)
            if not h or h[-1].unit != cur.unit or k not in summary.keys:
                continue
            rate = h[-1].slope if h[-1].slope > 0 else slope
            pk = h[-1].peak
            cand = steps_to_limit(limit, pk, rate)
            if cand is not None and cand < best:
                best, peak_now = cand, pk
    return peak_now, best


def remaining_steps(cur: EpochStats, total_steps: int | None, steps_done: int,
                    horizon_s: float) -> float:
    """Steps this run has left: from its planned length (``total_steps``) when known, else the
    steps that fit in ``horizon_s`` of wall time at the current pace."""
    if total_steps:
        return max(float(total_steps) - float(steps_done), 0.0)
    return horizon_s / max(cur.seconds_per_step, 1e-9)


def consequence(steps_to_oom: float | None, cur: EpochStats, remaining: float,
                critical_checks: float) -> Severity:
    """Severity by consequence: ``warning`` when the forecast reaches the limit within the
    ``remaining`` steps of the run (:func:`remaining_steps`), ``critical`` when that is also
    within ``critical_checks`` units of the one judged (counted in steps, so that a busy machine
    says the same); ``info`` otherwise (slower growth, or no limit to forecast against)."""
    if steps_to_oom is None or steps_to_oom > remaining:
        return "info"
    return "critical" if steps_to_oom <= critical_checks * cur.n_steps else "warning"
