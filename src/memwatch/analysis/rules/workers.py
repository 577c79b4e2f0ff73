"""DataLoader workers: per-worker growth (a leak in the Dataset) or copy-on-write (not a leak).

Worker USS rising while worker RSS stays flat is copy-on-write: forked workers turn shared pages
private one by one as Python touches the parent's objects (pytorch#13246); it stops when every
page has been copied. USS and RSS rising together is each worker accumulating its own state.
"""

from __future__ import annotations

import math

import numpy as np

from memwatch.analysis.context import AnalyzerConfig
from memwatch.analysis.rules import worker_count
from memwatch.analysis.rules.base import Rule, RuleInput
from memwatch.analysis.rules.leak import accumulation, plateau
from memwatch.analysis.rules.words import forecast_words, span, where
from memwatch.analysis.stats.forecast import consequence, remaining_steps, steps_to_limit
from memwatch.analysis.stats.held import verdict
from memwatch.analysis.stats.shapes import EpochStats, last_value
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes
from memwatch.timeline import EpochSummary

__all__ = ["RULE", "judge"]

METRIC = "workers.uss"


def judge(inp: RuleInput) -> list[Finding]:
    """The verdict on the DataLoader workers' private memory at this check."""
    metric, summary, history, ctx, cfg = METRIC, inp.summary, inp.history, inp.ctx, inp.cfg
    if ctx.defer_leaks or metric not in inp.stats or "workers.count" not in summary.keys:
        return []
    hist = history[metric]
    cur = hist[-1]
    rss_hist = history.get("workers.rss", [])
    rss = rss_hist[-1] if rss_hist and rss_hist[-1].unit == cur.unit else None
    count = last_value(summary, "workers.count")
    if not count:
        return []
    if worker_count.rising(history.get(worker_count.COUNT, [])):
        # More workers, not bigger ones: the count's own finding (once it names who keeps the
        # old DataLoaders), never "each worker accumulates its own state".
        f = worker_count.judge(history, ctx, cfg, inp.evidence.loaders_with_workers)
        return [f] if f is not None else []
    uss_gain = max(cur.rise, cur.growth)
    rss_gain = max(rss.rise, rss.growth) if rss is not None else 0.0
    copied = _cow_floor(cur, summary, cfg, int(count))
    cow = uss_gain if cur.shape in ("growing", "plateau") and uss_gain > cur.threshold and \
        rss_gain < 0.25 * uss_gain and uss_gain >= copied else 0.0
    if not cow and len(hist) == 1:
        cow = _first_unit_cow(summary, cur, cfg, copied)
    if cow:
        return [worker_cow(ctx.origin, metric, cur, rss, int(count), cow)]
    # Three units of evidence for workers: their warm-up often spans the first two. Units in
    # which workers were still starting (the count's floor below today's) are no evidence.
    steady = _steady(hist, history.get(worker_count.COUNT, []))
    v = verdict(steady, cfg) if len(steady) >= 3 else "pending"
    if v == "leak" and not _private_growth(steady, rss_hist):
        v = "none"  # USS up, RSS not: shared pages copied one by one, not new memory
    if v == "leak":
        limit = ctx.limit("host.rss")
        slope = cur.slope if cur.shape == "growing" else \
            (steady[-1].floor - steady[-2].floor) / max(cur.n_steps, 1)
        steps_to_oom = steps_to_limit(limit, cur.peak, slope)
        return [worker_leak(ctx.origin, metric, steady, slope, int(count), steps_to_oom,
                            consequence(steps_to_oom, cur, ctx, cfg), limit=limit,
                            remaining=remaining_steps(cur, ctx),
                            run_known=bool(ctx.total_steps),
                            limit_name=ctx.limit_name("host.rss"))]
    if v == "accumulation":
        prev = steady[-2] if len(steady) > 1 else None
        return [accumulation(ctx.origin, metric, cur, prev)]
    if cur.shape == "plateau":
        return [plateau(ctx.origin, metric, cur)]
    return []


def _steady(hist: list[EpochStats], counts: list[EpochStats]) -> list[EpochStats]:
    """The units of ``hist`` in which the workers of today were all alive: a unit whose count
    floor is below the latest one's holds samples from before some of them started."""
    if not counts or counts[-1].unit != hist[-1].unit:
        return hist
    floor = {c.unit: c.floor for c in counts}
    now = counts[-1].floor
    return [h for h in hist if floor.get(h.unit, now) >= now]


def _private_growth(hist: list[EpochStats], rss_hist: list[EpochStats]) -> bool:
    """Did the workers' RSS rise with their USS over the last two units? New private memory
    (a cache in the Dataset) raises both alike; copy-on-write raises USS alone: what the workers
    had shared with the parent becomes private, RSS stays. Half-way decides. True when RSS is
    not known."""
    units = {r.unit: r for r in rss_hist}
    prev, cur = hist[-2], hist[-1]
    rp, rc = units.get(prev.unit), units.get(cur.unit)
    if rp is None or rc is None:
        return True
    uss_up = cur.lo_end - prev.floor
    rss_up = rc.lo_end - rp.floor
    return uss_up <= 0 or rss_up >= 0.5 * uss_up


def _cow_floor(cur: EpochStats, summary: EpochSummary, cfg: AnalyzerConfig,
               workers: int) -> float:
    """The least private growth worth calling copy-on-write: what any info finding needs,
    ``cow_min_share`` of the job's private memory (this process's USS over the unit, where
    known, plus the workers'), and ``cow_min_per_worker`` for each worker."""
    parent = 0.0
    if "host.uss" in summary.keys:
        _, uss = summary.series("host.uss", "floor")
        uss = uss[~np.isnan(uss)]
        parent = float(np.median(uss)) if len(uss) else 0.0
    least = max(cfg.shape.min_growth_bytes, cfg.info_min_rel * abs(cur.level))
    return max(least, cfg.cow_min_share * (max(parent, 0.0) + max(cur.level, 0.0)),
               cfg.cow_min_per_worker * max(workers, 1))


def _first_unit_cow(summary: EpochSummary, cur: EpochStats, cfg: AnalyzerConfig,
                    copied: float) -> float:
    """Copy-on-write that saturates inside the first unit: the shape statistics leave out the
    first unit's warm-up and see little of it, so the raw series decide. The baseline is a tenth
    of the unit (at least two samples) after every worker is alive, and after their RSS has
    settled: a worker's own start-up (imports, unpickling, its first batches) copies a few MiB
    of the parent's pages in any Dataset, and under load the first samples may catch it
    half-way. Private growth raises RSS as much as USS (ratio 1), copy-on-write raises USS alone
    (ratio 0): half-way decides. Returns the copied bytes (0.0: none worth a finding)."""
    try:
        _, uss = summary.series("workers.uss", "floor")
        _, rss = summary.series("workers.rss", "floor")
        _, cnt = summary.series("workers.count", "floor")
    except (KeyError, ValueError):
        return 0.0
    ok = ~(np.isnan(uss) | np.isnan(rss) | np.isnan(cnt))
    uss, rss, cnt = uss[ok], rss[ok], cnt[ok]
    if len(uss) < 6:
        return 0.0
    full = np.nonzero(cnt >= cnt.max())[0]
    k = max(2, len(uss) // 10)
    # ... and not before the workers' RSS has made nine tenths of its rise in the unit: their
    # start-up allocates private pages (RSS and USS alike), and on a busy machine it lasts
    # longer than a tenth of the unit.
    rss_max = float(np.max(rss[full[0]:]))
    settle = rss_max - max(cfg.shape.min_growth_bytes, 0.1 * (rss_max - float(rss[full[0]])))
    settled = np.nonzero(rss[full[0]:] >= settle)[0]
    first = max(int(full[0]) + k, int(full[0]) + int(settled[0]))
    if first >= len(uss) - k:
        return 0.0
    uss_gain = float(np.min(uss[-k:]) - uss[first])
    rss_gain = float(np.max(rss[first:]) - rss[first])
    cow = uss_gain > cur.threshold and uss_gain >= copied and rss_gain < 0.5 * uss_gain
    return uss_gain if cow else 0.0


# --------------------------------------------------------------------------- wording

def worker_leak(origin: Origin, metric: str, stats: list[EpochStats], slope: float,
                workers: int, steps_to_oom: float | None, severity: Severity, *,
                limit: float | None = None, remaining: float = math.inf,
                run_known: bool = False, limit_name: str | None = None) -> Finding:
    cur = stats[-1]
    seconds = None if steps_to_oom is None else steps_to_oom * cur.seconds_per_step
    msg = (
        f"{where(metric)} grows by {fmt_bytes(slope)} per step {span(stats)} "
        f"({workers} workers, floor {fmt_bytes(stats[0].floor)} → {fmt_bytes(cur.floor)}), and "
        "resident memory grows with it: each worker accumulates its own state (a per-worker "
        "cache in the Dataset, growing lists in __getitem__), which copy-on-write does not "
        "explain."
    ) + forecast_words(limit, steps_to_oom, seconds, severity, remaining, run_known,
                       limit_name)
    return origin.finding(
        kind="leak", metric=metric, severity=severity, message=msg, bytes_per_step=slope,
        steps_to_oom=steps_to_oom, seconds_to_oom=seconds,
        culprit=f"DataLoader worker processes ({workers}): per-worker growth in the Dataset",
        suggestions=[
            "Bound any cache your Dataset fills in `__getitem__` (it exists once per worker), "
            "or move it to shared storage (a numpy memmap, an Arrow table).",
            "With `persistent_workers=False` workers restart every epoch, which caps the "
            "growth at one epoch's worth.",
        ],
        evidence={"pattern": "per_worker_growth", "workers": workers,
                  "epoch_floors": [s.floor for s in stats[-6:]],
                  "mann_kendall_p": cur.trend.p},
    )


def worker_cow(origin: Origin, metric: str, cur: EpochStats, rss: EpochStats | None,
               workers: int, copied: float) -> Finding:
    msg = (
        f"{where(metric)} rose by {fmt_bytes(copied)} while their resident "
        "memory stayed flat: that is copy-on-write, not a leak. Forked workers share the "
        "parent's pages until they touch them, and Python touches every object it reads "
        "(reference counts), so shared pages become private one by one (pytorch#13246). It "
        "stops when every page has been copied; summed RSS counts shared pages once per worker "
        "and overstates it, USS/PSS are the honest numbers."
    )
    return origin.finding(
        kind="plateau", metric=metric, severity="info", message=msg,
        culprit=f"copy-on-write of the Dataset's Python objects in {workers} workers",
        suggestions=[
            "Keep the dataset in numpy arrays, a memmap or Arrow instead of lists/dicts of "
            "Python objects: their pages are never written, so they stay shared.",
        ],
        evidence={"pattern": "copy_on_write", "workers": workers, "uss_rise": copied,
                  "rss_rise": rss.rise if rss is not None else None},
    )


RULE = Rule(
    name="workers",
    kinds=frozenset({"leak", "accumulation", "plateau"}),
    once=frozenset({"accumulation", "plateau"}),
    judge=judge,
    reads=(METRIC, "workers.rss", worker_count.COUNT),
)
