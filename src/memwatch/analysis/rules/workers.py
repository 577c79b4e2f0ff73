"""DataLoader workers: each worker accumulating its own state (a leak in the Dataset).

USS and RSS rising together, held across checks, is each worker accumulating its own state (a
cache filled in ``__getitem__``). USS rising while RSS stays flat is copy-on-write, not a leak
(:mod:`.copy_on_write`); more workers rather than bigger ones is :mod:`.worker_count` (while the
count rises this rule says nothing). The
statistics start where every worker of a unit was up (:mod:`memwatch.analysis.stats.settle`),
so a leak in workers that start in epoch 0 is confirmed at the second check after they start,
unless the second unit grew at less than half the pace of the first (a worker's warm-up levels
off that way): then at the third. The workers' own censuses
(:mod:`memwatch.analysis.culprits.worker_census`) name the Dataset's container that grows, and
are evidence of their own: a container that grew before the last check and again since, at the
same pace and weighing a share of the growth, confirms the leak at the second check after the
workers start, when the series alone has only one unit of them.
"""

from __future__ import annotations

import math
from typing import Any

from memwatch.analysis.context import AnalyzerConfig
from memwatch.analysis.evidence import WorkerGrowth
from memwatch.analysis.rules.base import Rule, RuleInput
from memwatch.analysis.rules.words import accumulation, forecast_words, plateau, span, where
from memwatch.analysis.stats.forecast import steps_to_limit
from memwatch.analysis.stats.settle import COUNT, count_rising
from memwatch.analysis.stats.shapes import EpochStats, last_value
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes

__all__ = ["NAME", "RULE", "judge"]

NAME = "workers"
METRIC = "workers.uss"


def judge(inp: RuleInput) -> list[Finding]:
    """The verdict on the DataLoader workers' private memory at this check."""
    metric, summary, history, ctx, cfg = METRIC, inp.summary, inp.history, inp.ctx, inp.cfg
    if metric not in inp.stats or COUNT not in summary.keys:
        return []
    count = last_value(summary, COUNT)
    # The workers' own censuses, at every check they run at: what a check reads was answered
    # after the previous one (and this asks for the next).
    grown = inp.evidence.worker_growth() if count else None
    if ctx.defer_leaks:
        return []
    hist = history[metric]
    cur = hist[-1]
    rss_hist = history.get("workers.rss", [])
    rss = rss_hist[-1] if rss_hist and rss_hist[-1].unit == cur.unit else None
    if not count or count_rising(history.get(COUNT, [])):
        # More workers, not bigger ones: the worker_count rule's finding (once it names who
        # keeps the old DataLoaders), never "each worker accumulates its own state".
        return []
    # Units in which workers of today were not all up yet are no evidence (their statistics
    # already start where every worker of the unit was up).
    steady = _steady(hist, history.get(COUNT, []))
    v = cfg.held(steady) if len(steady) >= 2 else "pending"
    if v == "leak" and len(steady) == 2 and _slowing(steady, cfg.deceleration):
        v = "pending"  # a worker's warm-up levels off: the third unit tells
    # RSS of the unit before ``cur`` among the steady ones (by unit, as _private_growth reads it)
    prev_rss = {r.unit: r for r in rss_hist}.get(steady[-2].unit) if len(steady) >= 2 else None
    if _census_decides(v, steady) and \
            _held_in_census(grown, steady, rss, prev_rss, int(count), cfg):
        # The workers' own censuses are the evidence the series does not have yet: a
        # container of the Dataset grew over the stretch before the last check and again
        # since, at the same pace, explaining the workers' growth: held, not a warm-up.
        v = "leak"
    elif v == "leak" and not _private_growth(steady, rss_hist):
        v = "none"  # USS up, RSS not: shared pages copied one by one, not new memory
    if v == "leak":
        limit = ctx.limit("host.rss")
        slope = cur.slope if cur.shape == "growing" else \
            (steady[-1].floor - steady[-2].floor) / max(cur.n_steps, 1)
        steps_to_oom = steps_to_limit(limit, cur.peak, slope)
        return [worker_leak(ctx.origin, metric, steady, slope, int(count), steps_to_oom,
                            inp.severity(steps_to_oom, cur), limit=limit,
                            remaining=ctx.remaining(cur),
                            run_known=bool(ctx.total_steps),
                            limit_name=ctx.limit_name("host.rss"), grown=grown)]
    if v == "accumulation":
        prev = steady[-2] if len(steady) > 1 else None
        return [accumulation(ctx.origin, NAME, metric, cur, prev)]
    if cur.shape == "plateau" and not _copying(cur, rss):
        return [plateau(ctx.origin, NAME, metric, cur)]
    return []


def _census_decides(v: str, steady: list[EpochStats]) -> bool:
    """The series has no verdict of its own yet, so the workers' censuses may give it: one
    unit of the workers (or two, the second slowing: ``pending``), or two of which the latest
    added memory it still held at its end, whatever the shape of its readings inside.
    Workers' private memory often rises in steps (a cache filling the allocator's arenas, pages
    copied on write at an epoch's start: recorded, a cache of 2 KiB tensors read by 2 persistent
    workers, floors 18.2 → 33.5 MiB as two steps of 13.3 and 6.0), and how a unit's readings
    spread inside it (a step, a trend, or neither above the noise: a rise of 7.8 MiB read as
    flat beside a 5.3 MiB threshold) follows when the allocator took pages and when the
    background poll read them, which the machine's load moves; two such units in a row are the
    three-floor rule's, at the third unit (``none`` at the second)."""
    return v == "pending" or (v == "none" and len(steady) == 2 and
                              _gain(steady[-2], steady[-1]) > steady[-1].threshold)


def _gain(prev: EpochStats | None, cur: EpochStats) -> float:
    """What a unit added and still held at its end: its rise or trend inside, or its end floor
    above the previous unit's end floor (each the floor over a unit's last tenth, after its
    temporaries are freed: growth between the two ends, whichever way it was spread)."""
    inside = max(cur.rise, cur.growth)
    return inside if prev is None else max(inside, cur.lo_end - prev.lo_end)


def _held_in_census(grown: WorkerGrowth | None, steady: list[EpochStats],
                    rss: EpochStats | None, prev_rss: EpochStats | None, workers: int,
                    cfg: AnalyzerConfig) -> bool:
    """The workers' censuses show a container of the Dataset that gained elements before the
    last check and again since, not slower by more than ``cfg.deceleration`` (a cache filled
    once levels off), weighing at least ``cfg.retention_explained`` of the workers' private
    growth in this unit; that growth (:func:`_gain`) is above the unit's noise, and their
    resident memory rose with it (new memory, not copy-on-write)."""
    cur = steady[-1]
    prev = steady[-2] if len(steady) >= 2 else None
    uss_gain = _gain(prev, cur)
    if grown is None or not grown.attrs or uss_gain <= cur.threshold:
        return False
    a = grown.attrs[0]
    # Before the last check: the stretch before it, or the one before that where it was
    # shorter than a worker's poll (a check a few steps before an epoch's end, which the
    # workers had already fed) and showed nothing.
    prior = max(a.before, a.earlier)
    if prior <= 0 or a.len_delta < cfg.deceleration * prior:
        return False
    if rss is None or _gain(prev_rss, rss) < 0.5 * uss_gain:
        return False
    return a.bytes_delta * min(a.workers, workers) >= cfg.retention_explained * uss_gain


def _copying(cur: EpochStats, rss: EpochStats | None) -> bool:
    """USS levelled off while RSS did not rise with it: copy-on-write's to say."""
    rss_gain = max(rss.rise, rss.growth) if rss is not None else 0.0
    return rss_gain < 0.5 * max(cur.rise, cur.growth)


def _steady(hist: list[EpochStats], counts: list[EpochStats]) -> list[EpochStats]:
    """The units of ``hist`` in which the workers of today were all alive: a unit whose count
    floor is below the latest one's holds samples from before some of them started."""
    if not counts or counts[-1].unit != hist[-1].unit:
        return hist
    floor = {c.unit: c.floor for c in counts}
    now = counts[-1].floor
    return [h for h in hist if floor.get(h.unit, now) >= now]


def _slowing(hist: list[EpochStats], share: float) -> bool:
    """The latest unit grew at under ``share`` (a half) of the pace of the one before, its
    start-up step included. A worker's own
    warm-up does that (its allocator and interpreter settle over its first passes: measured on
    a numpy Dataset read by 2 persistent workers, +1.1 MiB in the first epoch, +0.4 in the
    second, +0.1 after); a leak keeps its pace. Two units of such a series are no verdict yet."""
    prev, cur = hist[-2], hist[-1]
    prev_gain = max(prev.rise, prev.growth)
    return cur.growth / max(cur.n_steps, 1) < share * prev_gain / max(prev.n_steps, 1)


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


# --------------------------------------------------------------------------- wording

def worker_leak(origin: Origin, metric: str, stats: list[EpochStats], slope: float,
                workers: int, steps_to_oom: float | None, severity: Severity, *,
                limit: float | None = None, remaining: float = math.inf,
                run_known: bool = False, limit_name: str | None = None,
                grown: WorkerGrowth | None = None) -> Finding:
    cur = stats[-1]
    culprit, fix, census = _held_in_workers(workers, grown)
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
        rule=NAME, kind="leak", metric=metric, severity=severity, message=msg,
        bytes_per_step=slope,
        steps_to_oom=steps_to_oom, seconds_to_oom=seconds,
        culprit=culprit,
        suggestions=[
            fix,
            "With `persistent_workers=False` workers restart every epoch, which caps the "
            "growth at one epoch's worth.",
        ],
        evidence={"pattern": "per_worker_growth", "workers": workers,
                  "epoch_floors": [s.floor for s in stats[-6:]],
                  "mann_kendall_p": cur.trend.p, **census},
    )


def _held_in_workers(workers: int, grown: WorkerGrowth | None
                     ) -> tuple[str, str, dict[str, Any]]:
    """(culprit, first fix, evidence) from the workers' own censuses: the Dataset's container
    that grows in them, by name, or why none is named."""
    generic = ("Bound any cache your Dataset fills in `__getitem__` (it exists once per "
               "worker), or move it to shared storage (a numpy memmap, an Arrow table).")
    where = f"DataLoader worker processes ({workers}): per-worker growth in the Dataset"
    if grown is None:
        return where, generic, {}
    census: dict[str, Any] = {"worker_census": {
        "answered": grown.answered, "datasets": grown.datasets[:4],
        "grown": [a.to_dict() for a in grown.attrs[:8]]}}
    if not grown.attrs:
        why = ("no worker answered a census yet" if not grown.answered else
               "the workers' own censuses found no container of the Dataset that grew: the "
               "growth is elsewhere in them (native memory, a library's cache)")
        return f"{where} ({why})", generic, census
    a = grown.attrs[0]
    what = f"{a.length:,} {a.element or 'items'}" if a.element else f"{a.length:,} items"
    owner = a.name.split(".", 1)[0]
    if a.len_delta <= 0:
        # Nothing since the latest request a worker saw, all of it in the stretch before: a
        # worker sees a request up to a poll late, after it made a short stretch's samples.
        held = (f"set on about {a.length:,} {owner} objects" if a.kind == "attribute" else
                f"{a.kind}, {what}")
        culprit = (f"`{a.name}` in each DataLoader worker ({held}, +{a.before:,} per worker "
                   f"in the stretch before the workers saw the last check, growing in "
                   f"{a.workers} of {grown.answered} workers)")
    else:
        held = (f"set on about {a.length:,} {owner} objects, on +{a.len_delta:,} more per "
                "worker" if a.kind == "attribute" else
                f"{a.kind}, {what}, +{a.len_delta:,} per worker")
        culprit = (f"`{a.name}` in each DataLoader worker ({held} since the last check, "
                   f"about +{fmt_bytes(a.bytes_delta)} per worker, growing in {a.workers} of "
                   f"{grown.answered} workers)")
    if a.kind == "attribute":
        fix = (f"`{a.name}` is filled in on every {owner} a worker reads (a "
               "`functools.cached_property`, a lazily opened file or model) and kept for the "
               "object's lifetime, in each worker's copy: keep it in a bounded cache "
               "(`functools.lru_cache(maxsize=N)` at module level) or close it after use.")
    elif a.kind == "cache":
        fix = (f"`{a.name}` is a functools cache filled in every worker: give it a bound "
               "(`maxsize=N`) or key it on what repeats; each worker keeps its own copy.")
    else:
        fix = (f"`{a.name}` grows in every worker (each keeps its own copy, filled in "
               "`__getitem__`): bound it (an OrderedDict that drops its oldest entry, "
               "`functools.lru_cache(maxsize=N)`), or move it to shared storage (a numpy "
               "memmap, an Arrow table).")
    return culprit, fix, census


RULE: Rule[RuleInput] = Rule(
    name=NAME,
    kinds=frozenset({"leak", "accumulation", "plateau"}),
    once=frozenset({"accumulation", "plateau"}),
    judge=judge,
    reads=(METRIC, "workers.rss", COUNT),
)
