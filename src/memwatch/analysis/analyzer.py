"""The analyzer: at every epoch end, per metric, a verdict with evidence.

Method (see docs/findings.md):

1. Per metric and epoch, statistics on bucket floors (:mod:`memwatch.analysis.shapes`): a robust
   trend (Mann–Kendall with autocorrelation correction, Theil–Sen with a confidence interval), a
   single-jump test and a saturation test classify the epoch as flat, growing, plateau or step.
2. A *leak* needs the epoch to be growing **and** the previous epoch's rise to still be held: the
   floor of this epoch sits above the floor of the previous one by at least half of what the
   previous epoch gained. Growth released at the epoch end is *accumulation*; growth that levels
   off is a *plateau*; a single jump is a *step change*. Floors that rise epoch after epoch by
   similar amounts are a leak too, even when no single epoch shows a significant trend.
3. A census of live tensors (and Python objects) at epoch ends, diffed against the previous one,
   names the culprit and its holder; on the host, growth that no live tensor or object explains is
   *allocator retention*, not a leak.
4. With ``MemWatch(tracemalloc=True)``, Python allocations diffed by site between epoch ends
   (:mod:`memwatch.analysis.allocations`) explain host growth the census cannot see (floats,
   strings, bytes, numpy buffers): growth of live traced allocations is a leak, named by the
   line that allocates it.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import time
from typing import Any

import numpy as np

from memwatch.analysis import explain
from memwatch.analysis.shapes import EpochStats, ShapeConfig, epoch_stats
from memwatch.analysis.trend import diff_noise, trend_test
from memwatch.core.findings import Finding, Severity
from memwatch.timeline import EpochSummary

log = logging.getLogger("memwatch")

# Metrics judged for leaks; the others are evidence.
LEAK_METRICS = ("device.allocated", "host.rss", "workers.uss")


@dataclasses.dataclass(frozen=True)
class AnalyzerConfig:
    """Tuning of the verdicts. The defaults are what the detection benchmark is scored with.

    Example::

        >>> from memwatch.analysis import AnalyzerConfig
        >>> AnalyzerConfig(near_oom_margin=0.05).near_oom_margin
        0.05
    """

    shape: ShapeConfig = ShapeConfig()
    carry_fraction: float = 0.5  # share of the previous epoch's rise that must still be held
    deceleration: float = 0.5  # slope (upper CI) under this share of the last epoch's: saturating
    near_oom_margin: float = 0.10  # near_oom when the epoch peak is within this share of the limit
    horizon_epochs: float = 2.0  # critical when OOM is forecast within this many epochs ...
    # ... or before the run's remaining steps when MemWatch(total_steps=...) is known.
    census_budget: float = 0.02  # auto census: at most this share of the epoch's wall time ...
    census_when_suspected: bool = True  # ... unless growth is suspected (then always)
    holder_budget_s: float = 5.0  # time allowed to name holders at one epoch end
    retention_explained: float = 0.2  # host growth explained by objects below this share
    info_min_rel: float = 0.01  # info findings (plateau, step) only above this share of level

    def __post_init__(self) -> None:
        for name in ("carry_fraction", "near_oom_margin", "census_budget", "retention_explained"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"AnalyzerConfig.{name}={v!r} must be between 0 and 1")
        if self.horizon_epochs <= 0:
            raise ValueError("AnalyzerConfig.horizon_epochs must be positive")


@dataclasses.dataclass
class _CensusRecord:
    epoch: int
    census: Any  # census.Census
    rss: float


class Analyzer:
    """Turns epoch summaries of a :class:`memwatch.MemWatch` into findings."""

    def __init__(self, session: Any, config: AnalyzerConfig | None = None) -> None:
        self.session = session
        self.config = config or AnalyzerConfig()
        self.history: dict[str, list[EpochStats]] = {}
        self._reported: set[tuple[str, str]] = set()
        self._censuses: list[_CensusRecord] = []
        self._census_cost_ms: float | None = None
        self.last_census_ms: float | None = None
        # Worker memory warms up for longer (lazy page faults of shared libraries, copy-on-write,
        # prefetch buffers) and its level is small: ask for 1% of the level per epoch.
        self._worker_shape = dataclasses.replace(
            self.config.shape, min_growth_rel=max(self.config.shape.min_growth_rel, 0.01))

    # ------------------------------------------------------------------ entry point
    def on_epoch_end(self, summary: EpochSummary) -> list[Finding]:
        tracer: Any = getattr(self.session, "_tracer", None)
        rss0 = tracer.rss() if tracer is not None else None
        try:
            return self._on_epoch_end(summary)
        finally:
            if rss0 is not None:
                # Under tracing, memwatch's own work here (the census) grows the traces and the
                # RSS: the next allocation-site diff must not take that for the user's growth.
                rss1 = tracer.rss()
                if rss1 is not None:
                    tracer.note_own_rss(summary.epoch, rss1 - rss0)

    def _on_epoch_end(self, summary: EpochSummary) -> list[Finding]:
        cfg = self.config
        stats: dict[str, EpochStats] = {}
        for metric in summary.keys:
            if not _judged(metric):
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
        trace_diff = self._trace_diff(summary)
        census_diff = self._maybe_census(summary, bool(suspects))

        findings: list[Finding] = []
        for metric in LEAK_METRICS:
            if metric in stats:
                findings.extend(self._judge(metric, summary, census_diff, trace_diff))
        findings.extend(self._fragmentation(summary))
        findings.extend(self._near_oom(summary, stats))
        for f in findings:
            f.epoch = summary.epoch
            f.step = summary.end_step
        return findings

    # ------------------------------------------------------------------ leak family
    def _judge(self, metric: str, summary: EpochSummary, census_diff: Any,
               trace_diff: Any = None) -> list[Finding]:
        hist = self.history[metric]
        cur = hist[-1]
        prev = hist[-2] if len(hist) >= 2 else None
        if metric.startswith("workers.") and summary.keys.count("workers.count"):
            return self._judge_workers(metric, summary, hist)
        verdict = self._verdict(hist)
        if not metric.startswith("host."):
            trace_diff = None  # tracemalloc sees host allocations only
        if verdict == "leak" and metric.startswith("host.") and census_diff is None and \
                getattr(self.session, "census_mode", "auto") != "never" and \
                not self._traced_explains(trace_diff):
            # Host growth without a census at two epoch ends cannot be told apart from native
            # start-up growth or allocator retention: this epoch's census was just taken, so the
            # verdict (with its culprit) comes at the next epoch end. (Unless live traced Python
            # allocations grew by as much: that is user code, named by its allocation site.)
            return []
        if verdict == "leak":
            f = self._leak_finding(metric, summary, hist, census_diff, trace_diff)
            return [f] if f is not None else []
        if verdict == "accumulation":
            return self._once(metric, "accumulation", explain.accumulation(metric, cur, prev))
        if (cur.shape == "plateau" or verdict == "decelerating") and \
                self._worth_reporting(cur, max(cur.rise, cur.growth)):
            return self._once(metric, "plateau", explain.plateau(metric, cur))
        if cur.shape == "step" and len(hist) > 1 and self._worth_reporting(cur, cur.step_height):
            # (a jump in the first epoch is warm-up: optimizer state, lazy initialisation)
            return [explain.step_change(metric, cur)]
        return []

    def _worth_reporting(self, cur: EpochStats, amount: float) -> bool:
        """Informational findings only for changes a person would care about."""
        return amount >= max(self.config.shape.min_growth_bytes,
                             self.config.info_min_rel * abs(cur.level))

    def _verdict(self, hist: list[EpochStats]) -> str:
        """'leak', 'accumulation', 'decelerating', 'pending' or 'none' for the latest epoch."""
        cfg = self.config
        cur = hist[-1]
        prev = hist[-2] if len(hist) >= 2 else None
        if cur.shape == "growing":
            if prev is None:
                return "pending"  # one epoch cannot tell a leak from epoch-scoped accumulation
            prev_gain = max(prev.rise, prev.growth if prev.shape == "growing" else 0.0)
            held = cur.floor - prev.floor
            # A saturating curve (a cache filling, pools settling) keeps growing, only slower
            # every epoch: a leak keeps its rate.
            decelerating = prev.shape == "growing" and \
                cur.trend.slope_high < cfg.deceleration * prev.slope
            if prev_gain > prev.threshold and held >= cfg.carry_fraction * prev_gain \
                    and held > cur.threshold * 0.5 and not decelerating:
                return "leak"
            if decelerating:
                return "decelerating"
            if prev_gain > prev.threshold and held < 0.25 * prev_gain:
                return "accumulation"
            return "pending"
        # Slow or stair-like leaks: RSS often rises in jumps (the C allocator fills its free
        # pools first, then grows the heap), so no single epoch shows a steady trend; the epoch
        # floors still climb, epoch after epoch, by similar amounts.
        if len(hist) >= 3 and cur.shape in ("flat", "growing", "step"):
            floors = np.array([h.floor for h in hist[-3:]])
            inc = np.diff(floors)
            thr = max(h.threshold for h in hist[-3:])
            if (inc > thr).all() and inc[-1] >= 0.4 * inc[0]:
                return "leak"
        return "none"

    def _leak_finding(self, metric: str, summary: EpochSummary, hist: list[EpochStats],
                      census_diff: Any, trace_diff: Any = None) -> Finding | None:
        cur = hist[-1]
        slope = cur.slope
        low, high = cur.trend.slope_low, cur.trend.slope_high
        if cur.shape != "growing" and len(hist) >= 2:
            # Cross-epoch leak: the rate from the epoch floors.
            steps = sum(h.n_steps for h in hist[-3:])
            slope = (hist[-1].floor - hist[-3 if len(hist) >= 3 else -2].floor) / max(steps, 1)
            low, high = slope * 0.5, slope * 1.5
        limit = self._limit(metric)
        peak_now, steps_to_oom = self._forecast(metric, summary, cur, slope, limit)
        seconds_to_oom = None if steps_to_oom is None else steps_to_oom * cur.seconds_per_step
        horizon = self._horizon_steps(cur)
        soon = steps_to_oom is not None and steps_to_oom <= horizon
        severity: Severity = "critical" if soon else "warning"
        attribution = self._attribute(metric, cur, census_diff)
        if trace_diff is not None:
            self._attribute_traced(attribution, cur, trace_diff)
        if attribution.get("own_growth"):
            # memwatch's own tracing bookkeeping: nothing of the user's to report.
            log.debug("memwatch: %s grew by %s, memwatch's own while tracing; no finding",
                      metric, attribution.get("tracemalloc_summary"))
            return None
        if attribution.get("retention") and metric == "host.rss":
            return explain.allocator_retention(metric, cur, slope, attribution, summary)
        f = explain.leak(
            metric=metric,
            stats=hist,
            slope=slope,
            slope_ci=(low, high),
            limit=limit,
            peak_now=peak_now,
            steps_to_oom=steps_to_oom,
            seconds_to_oom=seconds_to_oom,
            severity=severity,
            attribution=attribution,
        )
        f.evidence["horizon_steps"] = horizon
        return f

    def _judge_workers(self, metric: str, summary: EpochSummary,
                       hist: list[EpochStats]) -> list[Finding]:
        cur = hist[-1]
        rss_hist = self.history.get("workers.rss", [])
        rss = rss_hist[-1] if rss_hist and rss_hist[-1].epoch == cur.epoch else None
        count = _last(summary, "workers.count")
        if not count:
            return []
        uss_gain = max(cur.rise, cur.growth)
        rss_gain = max(rss.rise, rss.growth) if rss is not None else 0.0
        cow = cur.shape in ("growing", "plateau") and uss_gain > cur.threshold and \
            rss_gain < 0.25 * uss_gain
        if cow:
            return self._once(metric, "plateau", explain.worker_cow(metric, cur, rss, int(count)))
        # Three epochs of evidence for workers: their warm-up often spans the first two.
        verdict = self._verdict(hist) if len(hist) >= 3 else "pending"
        if verdict == "leak":
            limit = self._limit("host.rss")
            slope = cur.slope if cur.shape == "growing" else \
                (hist[-1].floor - hist[-2].floor) / max(cur.n_steps, 1)
            steps_to_oom = (limit - cur.peak) / slope if limit and slope > 0 else None
            return [explain.worker_leak(metric, hist, slope, int(count), steps_to_oom,
                                        self._horizon_steps(cur))]
        if verdict == "accumulation":
            prev = hist[-2] if len(hist) > 1 else None
            return self._once(metric, "accumulation", explain.accumulation(metric, cur, prev))
        if cur.shape == "plateau":
            return self._once(metric, "plateau", explain.plateau(metric, cur))
        return []

    # ------------------------------------------------------------------ fragmentation, near_oom
    def _fragmentation(self, summary: EpochSummary) -> list[Finding]:
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
        alloc_hist = self.history.get("device.allocated", [])
        alloc = alloc_hist[-1] if alloc_hist and alloc_hist[-1].epoch == summary.epoch else None
        if alloc is not None and alloc.shape == "growing":
            return []  # reserved follows a growing allocation: that is the leak, not fragments
        tr = trend_test(t, gap)
        total = self._limit("device.reserved") or float(np.nanmax(r))
        rise = float(gap[-max(2, len(gap) // 10):].min() - gap[: max(2, len(gap) // 10)].min())
        retries = _delta(summary, "device.alloc_retries")
        split = _last(summary, "device.inactive_split") or 0.0
        reserved_now = _last(summary, "device.reserved") or 0.0
        thr = max(self.config.shape.min_growth_bytes, 0.01 * reserved_now,
                  self.config.shape.noise_k * diff_noise(gap))
        grows = tr.increasing(self.config.shape.alpha) and rise > thr
        heavy = reserved_now > 0 and split > 0.3 * reserved_now and retries > 0
        if not (grows or heavy):
            return []
        return [explain.fragmentation(gap_now=float(gap[-1]), gap_rise=rise, slope=tr.slope,
                                      split=split, retries=retries, reserved=reserved_now,
                                      total=total)]

    def _near_oom(self, summary: EpochSummary, stats: dict[str, EpochStats]) -> list[Finding]:
        out = []
        margin = self.config.near_oom_margin
        for metric in ("device.peak", "device.reserved", "host.rss"):
            if metric not in summary.keys:
                continue
            limit = self._limit(metric)
            peak = float(summary.peak[summary.keys.index(metric)])
            if limit is None or math.isnan(peak) or peak < (1 - margin) * limit:
                continue
            out.append(explain.near_oom(metric, peak, limit, margin))
            if metric.startswith("device."):
                break  # one device finding is enough
        return out

    # ------------------------------------------------------------------ census / attribution
    def _maybe_census(self, summary: EpochSummary, suspected: bool) -> Any:
        mode = getattr(self.session, "census_mode", "auto")
        if mode == "never":
            return None
        from memwatch.analysis import census

        epoch_s = max(summary.t_end - summary.t_start, 1e-3)
        if mode == "auto" and not (suspected and self.config.census_when_suspected):
            est = self._census_cost_ms
            if est is None:
                est = len(gc.get_objects()) * 0.0006  # ~0.6 us per object, measured
            if est > self.config.census_budget * epoch_s * 1000.0:
                return None
        # The tracemalloc snapshot of this epoch end ran gc.collect() a moment ago; while
        # tracing, its allocation sites replace the per-type object counts (see take_census).
        tracer = getattr(self.session, "_tracer", None)
        tracing = tracer is not None and getattr(tracer, "active", False)
        collected = tracing and getattr(tracer, "collected_epoch", None) == summary.epoch
        try:
            c = census.take_census(collect=not collected, count_types=not tracing)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: tensor census failed (%s); culprits will not be named", e)
            return None
        self._census_cost_ms = c.elapsed_ms
        self.last_census_ms = c.elapsed_ms
        rss = _last(summary, "host.rss") or float("nan")
        rec = _CensusRecord(summary.epoch, c, rss)
        prev = self._censuses[-1] if self._censuses else None
        self._censuses = [*self._censuses[-1:], rec]  # keep two: memory stays bounded
        if prev is None:
            return None
        return (prev, rec)

    def _attribute(self, metric: str, cur: EpochStats, census_diff: Any) -> dict[str, Any]:
        if census_diff is None:
            mode = getattr(self.session, "census_mode", "auto")
            why = "turned off (census='never')" if mode == "never" else \
                "not taken at two epoch ends yet"
            return {"census": why}
        from memwatch.analysis import census

        prev, rec = census_diff
        t0 = time.perf_counter()
        dev_prefix = "cpu" if metric.startswith("host.") else _device_prefix(self.session)
        growths = census.diff(prev.census, rec.census, dev_prefix)
        types = census.type_growth(prev.census, rec.census)
        out: dict[str, Any] = {
            "census_ms": round(rec.census.elapsed_ms, 1),
            "objects_scanned": rec.census.objects,
            "tensors_scanned": rec.census.tensors,
            "census_epochs": [prev.epoch, rec.epoch],
            "growing_groups": [
                {**g.group.to_dict(), "count_delta": g.count_delta, "bytes_delta": g.bytes_delta}
                for g in growths[:8]
            ],
            "python_object_growth": types,
        }
        # Candidates: the largest growth by bytes, plus groups with autograd history (a scalar
        # loss kept with its graph is tiny itself but holds the graph's saved activations).
        cands = growths[:6] + [g for g in growths[6:] if g.group.grad_fn][:4]
        wanted = {}
        for g in cands:
            ids = g.new_ids or g.group.ids
            if ids:
                wanted[id(g)] = ids[len(ids) // 2]
        objs = census.objects_by_ids(set(wanted.values()))
        scored = []
        obj = None
        for g in cands:
            obj = objs.get(wanted.get(id(g), -1))
            gb = 0
            if obj is not None and g.group.grad_fn:
                gb, _ = census.graph_bytes(obj)
            scored.append((g.bytes_delta + gb * max(g.count_delta, 0), g, gb))
        del obj
        scored.sort(key=lambda x: x[0], reverse=True)
        deadline = time.perf_counter() + self.config.holder_budget_s
        for eff, g, gb in scored:
            if time.perf_counter() > deadline:
                break
            # Out of the dict before the walk: a container of ours must not be reported as
            # the holder (our frames are skipped, our dicts would not be).
            target = objs.pop(wanted.get(id(g), -1), None)
            if target is None or (g.count_delta <= 0 and g.bytes_delta <= 0):
                continue
            holder = census.holder_of(target, budget_s=max(deadline - time.perf_counter(), 0.1))
            del target
            if holder is None:
                continue
            out.update(holder=holder, group=g, graph_bytes=gb, effective_bytes=eff)
            break
        del objs
        if "holder" not in out and scored:
            out.update(group=scored[0][1], graph_bytes=scored[0][2], effective_bytes=scored[0][0])
        out["attribution_ms"] = round((time.perf_counter() - t0) * 1000.0, 1)
        # Host growth that no live tensor or Python object explains: the allocator kept it.
        if metric == "host.rss" and not math.isnan(prev.rss) and not math.isnan(rec.rss):
            rss_growth = rec.rss - prev.rss
            tensor_growth = sum(max(e, 0) for e, _, _ in scored)
            obj_growth = 64 * sum(d for _, d in types)
            explained = tensor_growth + obj_growth
            out["explained_bytes"] = explained
            out["rss_growth_bytes"] = rss_growth
            # Even when some small growing group has a holder, it is not *the* leak if it
            # explains only a sliver of the growth: native start-up growth and the C allocator's
            # retention look like this.
            # ... unless a named holder gains about one object per step or more: something
            # appended every step in user code is a leak even when its bytes are invisible
            # (a loss kept after backward() holds native autograd nodes, not tensors).
            per_step = "holder" in out and out["group"].count_delta >= 0.5 * max(cur.n_steps, 1)
            if rss_growth > 0 and not per_step and \
                    explained < self.config.retention_explained * rss_growth:
                out["retention"] = True
        return out

    # ------------------------------------------------------------------ tracemalloc
    def _trace_diff(self, summary: EpochSummary) -> Any:
        """This epoch end's allocation-site diff (``MemWatch(tracemalloc=...)``), or None."""
        tracer = getattr(self.session, "_tracer", None)
        d = getattr(tracer, "last", None)
        if d is None or d.epochs[1] != summary.epoch:
            return None
        return d

    def _traced_explains(self, d: Any) -> bool:
        """Live traced Python allocations grew by a fair share of the host growth: user code
        keeps them (a leak), the allocator does not (retention)."""
        if d is None:
            return False
        grew = min(d.traced_growth, d.traced_net)  # net: what was released elsewhere counts
        if grew <= 0:
            return False
        rss = d.explainable_rss_growth()
        if rss is None or rss <= 0:
            return bool(grew >= self.config.shape.min_growth_bytes)
        return bool(grew >= self.config.retention_explained * rss)

    def _attribute_traced(self, out: dict[str, Any], cur: EpochStats, d: Any) -> None:
        """Add the allocation sites that grew; they overrule a retention verdict when they
        explain the growth, and name the culprit when no holder of tensors was named."""
        steps = d.steps or cur.n_steps
        out["tracemalloc"] = [g.to_dict(steps) for g in d.growths[:8]]
        out["tracemalloc_summary"] = d.summary()
        explains = self._traced_explains(d)
        out["tracemalloc_summary"]["explains_growth"] = explains
        if explains:
            # Growth of live Python allocations: a leak in user code, not allocator retention.
            out.pop("retention", None)
        elif out.get("retention") and d.rss_growth is not None and \
                d.rss_growth - d.own_rss_growth <= cur.threshold:
            # What grew is memwatch's own while tracing (the traces, the snapshot's objects the
            # allocator kept): not the user's.
            out["own_growth"] = True
        if not d.growths or "holder" in out:
            return
        top = d.growths[0]
        rss = d.explainable_rss_growth()
        big = rss is None or rss <= 0 or top.bytes_delta >= 0.1 * rss
        # A block kept every step at a line of user code names it even when the bytes are
        # elsewhere (a tensor's storage is not a traced Python allocation, its object is).
        per_step = top.user and top.count_delta >= 0.5 * max(steps, 1)
        if (explains and big) or per_step:
            out["site"] = top

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

    def _limit(self, metric: str) -> float | None:
        try:
            lim = self.session.limits().get(metric)
        except Exception:  # noqa: BLE001
            return None
        if lim is None and metric.startswith("workers."):
            lim = self.session.limits().get("host.rss")
        return float(lim) if lim else None

    def _forecast(self, metric: str, summary: EpochSummary, cur: EpochStats, slope: float,
                  limit: float | None) -> tuple[float, float | None]:
        """(peak used, steps to OOM): the earliest crossing among the metrics that must fit.

        On a device, allocations fail when *reserved* memory (allocated plus the allocator's
        cache) or the per-step *peak* reaches capacity, so each is extrapolated with its own rate.
        """
        peak_now = cur.peak
        if limit is None or slope <= 0:
            return peak_now, None
        best = max(limit - cur.peak, 0.0) / slope
        if metric == "device.allocated":
            for k in ("device.peak", "device.reserved"):
                h = self.history.get(k)
                if not h or h[-1].epoch != cur.epoch or k not in summary.keys:
                    continue
                rate = h[-1].slope if h[-1].slope > 0 else slope
                pk = h[-1].peak
                if math.isnan(pk):
                    continue
                cand = max(limit - pk, 0.0) / rate
                if cand < best:
                    best, peak_now = cand, pk
        return peak_now, best

    def _horizon_steps(self, cur: EpochStats) -> float:
        total = getattr(self.session, "total_steps", None)
        done = getattr(self.session, "step_count", 0)
        if total:
            return max(float(total) - float(done), 0.0)
        return self.config.horizon_epochs * cur.n_steps


def _judged(metric: str) -> bool:
    # The leak metrics, plus the ones their verdicts and forecasts lean on.
    return metric in ("device.allocated", "device.reserved", "device.peak", "host.rss",
                      "workers.uss", "workers.rss")


def _last(summary: EpochSummary, key: str) -> float | None:
    if key not in summary.keys:
        return None
    v = float(summary.last[summary.keys.index(key)])
    return None if math.isnan(v) else v


def _delta(summary: EpochSummary, key: str) -> float:
    if key not in summary.keys:
        return 0.0
    i = summary.keys.index(key)
    v = float(summary.last[i] - summary.first[i])
    return 0.0 if math.isnan(v) else v


def _device_prefix(session: Any) -> str:
    dev = getattr(session, "device", None)
    kind = getattr(dev, "kind", "cuda")
    return "mps" if kind == "mps" else "cuda"


__all__ = ["LEAK_METRICS", "Analyzer", "AnalyzerConfig"]
