"""The analyzer: at every check, per metric, a verdict with evidence. It only orchestrates.

Method (see docs/findings.md); each rule lives in its own module:

1. Per metric and epoch, statistics on bucket floors (:mod:`.shapes`): a robust trend
   (Mann–Kendall with autocorrelation correction, Theil–Sen with a confidence interval), a
   single-jump test and a saturation test classify the epoch as flat, growing, plateau or step.
2. Leaks, accumulation, plateaus and step changes of host and device memory (:mod:`.leak`), of
   DataLoader workers (:mod:`.workers`), fragmentation (:mod:`.fragmentation`), near-OOM
   (:mod:`.near_oom`), with forecasts (:mod:`.forecast`).
3. A census of live tensors (and Python objects) at checks, diffed against the previous one,
   names the culprit and its holder (:mod:`.attribution`); it is scheduled here, where its cost
   is weighed against the epoch's length.
"""

from __future__ import annotations

import dataclasses
import gc
import logging

from memwatch.analysis import census as census_mod
from memwatch.analysis import fragmentation, leak, near_oom, workers
from memwatch.analysis.attribution import CensusRecord
from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.shapes import EpochStats, epoch_stats, last_value
from memwatch.core.findings import Finding
from memwatch.timeline import EpochSummary

log = logging.getLogger("memwatch")

# Metrics judged for leaks; the others are evidence.
LEAK_METRICS = ("device.allocated", "host.rss", "workers.uss")
# The leak metrics, plus the ones their verdicts and forecasts lean on.
_JUDGED = ("device.allocated", "device.reserved", "device.peak", "host.rss", "workers.uss",
           "workers.rss")


class Analyzer:
    """Turns epoch summaries into findings; it keeps the per-metric history between checks.

    Example::

        >>> import numpy as np
        >>> from memwatch.analysis import Analyzer, CheckContext
        >>> from memwatch.timeline import Timeline
        >>> tl, analyzer = Timeline(["device.allocated"]), Analyzer()
        >>> for epoch in range(3):
        ...     for s in range(200):
        ...         step = epoch * 200 + s
        ...         tl.append(step, float(step), [float(step * 2**20)])
        ...     found = analyzer.check(tl.end_epoch(), CheckContext(census="never"))
        >>> [(f.kind, f.metric) for f in found]
        [('leak', 'device.allocated')]
    """

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config or AnalyzerConfig()
        self.history: dict[str, list[EpochStats]] = {}
        self._reported: set[tuple[str, str]] = set()
        self._censuses: list[CensusRecord] = []
        self._census_cost_ms: float | None = None
        #: Milliseconds the last census took (None until one ran).
        self.last_census_ms: float | None = None
        # Worker memory warms up for longer (lazy page faults of shared libraries, copy-on-write,
        # prefetch buffers) and its level is small: ask for 1% of the level per epoch.
        self._worker_shape = dataclasses.replace(
            self.config.shape, min_growth_rel=max(self.config.shape.min_growth_rel, 0.01))

    def check(self, summary: EpochSummary, ctx: CheckContext) -> list[Finding]:
        """The new findings of one check (``summary``: the epoch, or the stretch, judged)."""
        cfg = self.config
        stats: dict[str, EpochStats] = {}
        for metric in summary.keys:
            if metric not in _JUDGED:
                continue
            hist = self.history.setdefault(metric, [])
            shape_cfg = self._worker_shape if metric.startswith("workers.") else cfg.shape
            st = epoch_stats(summary, metric, shape_cfg, first_epoch=not hist)
            if st is None:
                continue
            hist.append(st)
            del hist[:-16]  # bounded: verdicts look back a few epochs only
            stats[metric] = st

        # Suspected growth (a census is then worth its cost): a trend or a jump inside the epoch,
        # or a floor above the previous epoch's. The census at the epoch *before* a verdict is
        # what lets the verdict tell user code from native growth.
        suspects = {m for m, st in stats.items() if not m.startswith("workers.") and (
            st.shape in ("growing", "step") or st.rise > st.threshold or self._floor_rose(m))}
        pair = self._maybe_census(summary, ctx, bool(suspects))

        findings: list[Finding] = []
        for metric in LEAK_METRICS:
            if metric not in stats:
                continue
            if metric.startswith("workers.") and "workers.count" in summary.keys:
                findings.extend(workers.judge(metric, summary, self.history, ctx, cfg,
                                              self._once))
            else:
                findings.extend(leak.judge(metric, summary, self.history, pair, ctx, cfg,
                                           self._once))
        findings.extend(fragmentation.judge(summary, self.history, ctx, cfg))
        findings.extend(near_oom.judge(summary, ctx, cfg))
        return findings

    # ------------------------------------------------------------------ census scheduling
    def _maybe_census(self, summary: EpochSummary, ctx: CheckContext,
                      suspected: bool) -> tuple[CensusRecord, CensusRecord] | None:
        if ctx.census in ("never", "skip"):
            return None
        epoch_s = max(summary.t_end - summary.t_start, 1e-3)
        if ctx.census == "auto" and not (suspected and self.config.census_when_suspected):
            est = self._census_cost_ms
            if est is None:
                est = len(gc.get_objects()) * 0.0006  # ~0.6 us per object, measured
            if est > self.config.census_budget * epoch_s * 1000.0:
                return None
        # The tracemalloc snapshot of this check ran gc.collect() a moment ago; while tracing,
        # its allocation sites replace the per-type object counts (see take_census).
        try:
            c = census_mod.take_census(collect=not ctx.collected, count_types=not ctx.tracing)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: tensor census failed (%s); culprits will not be named", e)
            return None
        self._census_cost_ms = c.elapsed_ms
        self.last_census_ms = c.elapsed_ms
        rss = last_value(summary, "host.rss")
        rec = CensusRecord(summary.epoch, c, float("nan") if rss is None else rss)
        prev = self._censuses[-1] if self._censuses else None
        self._censuses = [*self._censuses[-1:], rec]  # keep two: memory stays bounded
        return None if prev is None else (prev, rec)

    # ------------------------------------------------------------------ helpers
    def _floor_rose(self, metric: str) -> bool:
        h = self.history.get(metric, [])
        return len(h) >= 2 and h[-1].floor - h[-2].floor > h[-1].threshold

    def _once(self, metric: str, kind: str, f: Finding) -> list[Finding]:
        key = (metric, kind)
        if key in self._reported:
            return []
        self._reported.add(key)
        return [f]


__all__ = ["LEAK_METRICS", "Analyzer", "AnalyzerConfig", "CheckContext"]
