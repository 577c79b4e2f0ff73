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
from memwatch.analysis import fragmentation, leak, near_oom, outside, workers
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
           "workers.rss", "workers.count", "host.rss_anon", "host.rss_file", "host.rss_shmem",
           "device.outside_allocator")


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
        #: Per metric, the segments of the first epoch (or of a run without epochs) so far.
        self.segments: dict[str, list[EpochStats]] = {}
        self._last_objects: int | None = None  # objects counted by the last census
        #: Milliseconds the last census took (None until one ran).
        self.last_census_ms: float | None = None
        # Worker memory warms up for longer (lazy page faults of shared libraries, copy-on-write,
        # prefetch buffers) and its level is small: ask for 1% of the level per epoch.
        self._worker_shape = dataclasses.replace(
            self.config.shape, min_growth_rel=max(self.config.shape.min_growth_rel, 0.01))

    def check(self, summary: EpochSummary, ctx: CheckContext) -> list[Finding]:
        """The new findings of one check.

        ``summary`` is the epoch that just ended (``ctx.at == "epoch_end"``) or, at a check
        inside an epoch, the segment since the previous check. What a verdict compares:

        * at an epoch end, this epoch against the previous epochs (as always);
        * inside an epoch once an epoch has ended, per metric: when the last closed epoch grew
          inside, the epoch so far (``ctx.partial``) against the closed epochs, so that growth
          released at every epoch end stays accumulation; when it was flat inside, this
          epoch's segments after the closed epochs, so that a leak starting mid-run is
          confirmed at the second check after it starts;
        * inside the first epoch (or in a run without epochs): the segments between checks,
          each against the previous ones: the checks are the boundaries.
        """
        cfg = self.config
        if ctx.at == "epoch_end":
            stats = self._add(summary, self.history)
            self.segments = {}  # the epoch's segments are in its stats now
            judged = self.history
        else:
            seg_stats = self._add(summary, self.segments, first=not self.history)
            stats, judged = {}, {}
            for m, seg in seg_stats.items():
                closed = self.history.get(m, [])
                if not closed or ctx.partial is None:
                    stats[m], judged[m] = seg, self.segments[m]
                elif closed[-1].shape == "growing":
                    # Closed epochs grew inside (and, unless a leak was reported, let it go):
                    # only the epoch as a whole tells a leak from that accumulation.
                    st = self._stats(ctx.partial, m, first=False)
                    if st is not None:
                        stats[m], judged[m] = st, [*closed, st]
                else:
                    # Closed epochs were flat inside: this epoch's segments, after them.
                    stats[m], judged[m] = seg, [*closed[-2:], *self.segments[m]]

        # Suspected growth (a census is then worth its cost): a trend or a jump, or a floor
        # above the previous unit's. The census at the check *before* a verdict is what lets the
        # verdict tell user code from native growth.
        suspects = {m for m, st in stats.items() if not m.startswith("workers.") and (
            st.shape in ("growing", "step") or st.rise > st.threshold
            or _floor_rose(judged.get(m, [])))}
        pair = self._maybe_census(summary, ctx, bool(suspects))

        findings: list[Finding] = []
        for metric in LEAK_METRICS:
            if metric not in stats or ctx.defer_leaks:
                continue
            if metric.startswith("workers.") and "workers.count" in summary.keys:
                findings.extend(workers.judge(metric, summary, judged, ctx, cfg, self._once))
            else:
                findings.extend(leak.judge(metric, summary, judged, pair, ctx, cfg, self._once))
        findings.extend(fragmentation.judge(summary, judged, ctx, cfg))
        if outside.METRIC in judged:
            out_f = outside.judge(judged, ctx, cfg)
            if out_f is not None:
                findings.extend(self._once(outside.METRIC, "leak", out_f))
        findings.extend(near_oom.judge(summary, ctx, cfg))
        return findings

    def _stats(self, summary: EpochSummary, metric: str, first: bool) -> EpochStats | None:
        shape_cfg = self._worker_shape if metric.startswith("workers.") else self.config.shape
        return epoch_stats(summary, metric, shape_cfg, first_epoch=first)

    def _add(self, summary: EpochSummary, into: dict[str, list[EpochStats]],
             first: bool | None = None) -> dict[str, EpochStats]:
        """Stats of every judged metric of ``summary``, appended to ``into`` (bounded)."""
        out: dict[str, EpochStats] = {}
        for metric in summary.keys:
            if metric not in _JUDGED:
                continue
            hist = into.setdefault(metric, [])
            st = self._stats(summary, metric, first=not hist if first is None else first
                             and not hist)
            if st is None:
                continue
            hist.append(st)
            del hist[:-16]  # bounded: verdicts look back a few units only
            out[metric] = st
        return out

    # ------------------------------------------------------------------ census scheduling
    def _maybe_census(self, summary: EpochSummary, ctx: CheckContext,
                      suspected: bool) -> tuple[CensusRecord, CensusRecord] | None:
        """A census now? ``always``; ``auto``: when growth is suspected, or at an epoch end when
        the heap is small enough to be cheap (by its object count at the last census: never by
        the wall time, so that a busy machine takes the same censuses as a quiet one). Inside
        an epoch, ``auto`` takes one only when growth is suspected: the census is nearly all of
        a check's cost, and a flat segment needs none (the census at the check where growth
        is first suspected is the baseline the next check's verdict compares with)."""
        if ctx.census in ("never", "skip"):
            return None
        if ctx.census == "auto" and not (suspected and self.config.census_when_suspected):
            if ctx.at != "epoch_end":
                return None
            objects = self._last_objects
            if objects is None:
                objects = len(gc.get_objects())
            if objects > self.config.census_max_objects:
                return None
        # The tracemalloc snapshot of this check ran gc.collect() a moment ago; while tracing,
        # its allocation sites replace the per-type object counts (see take_census).
        try:
            c = census_mod.take_census(collect=not ctx.collected, count_types=not ctx.tracing)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: tensor census failed (%s); culprits will not be named", e)
            return None
        self._last_objects = c.objects
        self.last_census_ms = c.elapsed_ms
        rss = last_value(summary, "host.rss")
        rec = CensusRecord(summary.epoch, c, float("nan") if rss is None else rss,
                           step=summary.end_step)
        prev = self._censuses[-1] if self._censuses else None
        self._censuses = [*self._censuses[-1:], rec]  # keep two: memory stays bounded
        return None if prev is None else (prev, rec)

    # ------------------------------------------------------------------ helpers
    def _once(self, metric: str, kind: str, f: Finding) -> list[Finding]:
        key = (metric, kind)
        if key in self._reported:
            return []
        self._reported.add(key)
        return [f]


__all__ = ["LEAK_METRICS", "Analyzer", "AnalyzerConfig", "CheckContext"]


def _floor_rose(hist: list[EpochStats]) -> bool:
    return len(hist) >= 2 and hist[-1].floor - hist[-2].floor > hist[-1].threshold
