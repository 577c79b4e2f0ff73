"""Trend lines of the report's memory charts: what is held, how fast it grows, when it hits the
limit. The analyzer's rate is used when it gave a verdict on the metric, so the chart and the
finding never disagree; otherwise a Theil-Sen fit on bucket floors (the analyzer's own statistics).
"""

from __future__ import annotations

import dataclasses

from memwatch.report.data import ReportData, finite

__all__ = ["TrendLine", "fit_trend"]


@dataclasses.dataclass
class TrendLine:
    """A fitted line over a metric's held memory and, when it grows, its forecast.

    Example::

        >>> from memwatch.report.data import ReportData
        >>> from memwatch.report.trends import fit_trend
        >>> steps = list(range(1, 201))
        >>> d = ReportData(title="t", source="export", steps=steps,
        ...                values={"host.rss": [2**30 + s * 2**20 for s in steps]},
        ...                limits={"host.rss": 4 * 2**30})
        >>> t = fit_trend(d, "host.rss")
        >>> t.significant, t.slope == 2**20, round(t.limit_step)
        (True, True, 3072)
    """

    metric: str
    x0: float
    x1: float
    y0: float
    y1: float
    slope: float  # bytes per step
    source: str  # "analyzer" (a finding's bytes_per_step) or "fit" (Theil-Sen on floors)
    significant: bool
    limit: float | None = None
    limit_step: float | None = None  # where the line reaches the limit, when it does
    #: Where the growth stopped (the current belief about the metric says so): the line ends
    #: there and forecasts nothing.
    stopped_at: float | None = None
    #: The fit left out the first epoch (the warm-up), as the analyzer does.
    after_first_epoch: bool = False

    def describe(self) -> str:
        from memwatch.core.units import fmt_bytes

        if not self.significant:
            return "no significant growth of the memory held"
        how = ("the analyzer's verdict" if self.source == "analyzer"
               else "Theil-Sen fit on the floors" + (" after the first epoch"
                                                      if self.after_first_epoch else ""))
        s = f"{fmt_bytes(self.slope)}/step ({how})"
        if self.stopped_at is not None:
            s += f", until step {int(self.stopped_at):,}, where it stopped"
        if self.limit_step is not None and self.limit is not None:
            s += (f"; reaches the {fmt_bytes(self.limit)} limit near step "
                  f"{int(self.limit_step):,}")
        return s


def fit_trend(d: ReportData, metric: str) -> TrendLine | None:
    """Theil-Sen on bucket floors of ``metric`` (warm-up epoch dropped), or None. When the
    current belief about ``metric`` is growth that stopped, the line covers the growth only
    and forecasts nothing."""
    import numpy as np

    from memwatch.analysis.beliefs import current, state_of
    from memwatch.analysis.stats.trend import trend_test

    now = [f for f in current(d.findings) if f.get("metric") == metric]
    # Growth that stopped, or a container filling its own bound: no forecast to a limit.
    settled = next((f for f in now if state_of(f) in ("stopped", "bounded")), None)
    stop = settled if settled is not None and state_of(settled) == "stopped" else None
    stopped_at = finite((stop.get("evidence") or {}).get("flat_since_step")) if stop else None

    col = d.values.get(metric)
    if not col or len(d.steps) < 8:
        return None
    x = np.asarray(d.steps, dtype=np.float64)
    y = np.asarray([np.nan if v is None else v for v in col], dtype=np.float64)
    # Drop the first epoch (warm-up: the analyzer does not judge it either) when more follow.
    dropped = False
    if len(d.epochs) >= 2:
        first_end = d.epochs[0].get("end_step")
        if isinstance(first_end, (int, float)) and (x > first_end).sum() >= 8:
            keep = x > first_end
            x, y, dropped = x[keep], y[keep], True
    ok = np.isfinite(y)
    if stopped_at is not None and int((x <= stopped_at).sum()) >= 8:
        ok &= x <= stopped_at
    x, y = x[ok], y[ok]
    if len(y) < 8:
        return None
    nb = min(128, len(y))
    edges = np.linspace(0, len(y), nb + 1).astype(np.int64)
    floors = np.fmin.reduceat(y, edges[:-1])
    mids = x[(edges[:-1] + edges[1:] - 1) // 2]
    tr = trend_test(mids, floors)
    # Statistically significant is not enough: RSS creeping by a few hundred bytes per step is
    # real but harmless. Same magnitude floors as the analyzer: the fitted rise must exceed
    # 256 KiB, 0.02% of the level and four times the floors' noise.
    rise = tr.slope * float(mids[-1] - mids[0])
    level = float(np.nanmedian(floors))
    big = rise > max(256 * 1024, 2e-4 * abs(level), 4 * tr.noise)
    slope, significant, source = tr.slope, bool(tr.increasing() and big), "fit"
    # The current verdict's rate (a leak believed now); for growth that stopped, the rate of
    # the leak it was; for a container filling its bound, the fit's.
    for f in ([*now, *reversed(d.findings)] if settled is None else
              reversed(d.findings) if stop is not None else []):
        bps = finite(f.get("bytes_per_step"))
        if f.get("metric") == metric and f.get("kind") in ("leak", "near_oom") and bps:
            slope, significant, source = bps, True, "analyzer"
            break
    x0, x1 = float(mids[0]), float(mids[-1])
    y1 = float(tr.intercept + tr.slope * x1)
    y0 = y1 - slope * (x1 - x0)
    line = TrendLine(metric, x0, x1, y0, y1, float(slope), source, bool(significant),
                     stopped_at=stopped_at, after_first_epoch=dropped)
    limit = finite(d.limits.get(metric))
    if limit and limit > 0:
        line.limit = limit
        if significant and slope > 0 and y1 < limit and settled is None:
            line.limit_step = x1 + (limit - y1) / slope
    return line
