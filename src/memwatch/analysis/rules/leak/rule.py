"""Leaks of host and device memory: memory that is still held across checks and keeps growing.

A *leak* needs the unit judged (an epoch, or the stretch between two checks) to be growing **and**
the previous unit's rise to still be held (:func:`memwatch.analysis.stats.held.verdict`). Growth
released at the unit's end is *accumulation*; growth that levels off is a *plateau*; a single
jump is a *step change*. On the host, a leak needs live objects that explain it (the census diff,
through the evidence port); growth they do not explain is native memory or *allocator retention*
(its part :mod:`.native`), and growth that is mostly pages of mapped files is *mapped_file* (its
part :mod:`.mapped_file`, whose parts of RSS are then judged here one by one).

Judges ``device.allocated`` and ``host.rss`` (and ``workers.uss`` when the worker count is not
sampled; :mod:`.workers` judges it otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from memwatch.analysis.context import AnalyzerConfig
from memwatch.analysis.culprits.wording import culprit_of
from memwatch.analysis.evidence import Attribution, CensusPair
from memwatch.analysis.rules.base import Rule, RuleInput, SubRule
from memwatch.analysis.rules.leak import bounded, mapped_file, native
from memwatch.analysis.rules.words import (
    accumulation,
    benign,
    ci,
    forecast_words,
    plateau,
    span,
    where,
)
from memwatch.analysis.stats.forecast import forecast
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes

__all__ = ["BELIEF", "NAME", "RULE", "judge"]

log = logging.getLogger("memwatch")

NAME = "leak"

#: The metrics this rule judges for leaks (``workers.uss`` only without a worker count).
METRICS = ("device.allocated", "host.rss", "workers.uss")

#: The session's belief book (:mod:`memwatch.analysis.beliefs`) revises this rule's verdicts at
#: every later check: growth that stopped is said as a plateau by it, under this name.
BELIEF = SubRule(name="belief", kinds=frozenset({"plateau"}))


def judge(inp: RuleInput) -> list[Finding]:
    """The verdicts on host and device memory at this check.

    In the first epoch of a run planned to have more (``defer_leaks``) only held stairs are
    judged: memory kept across two boundaries is no epoch-scoped accumulation. Beside a
    training session (``beside_training``) only accumulation inside the evaluations is: what
    stays across them is the training session's to judge."""
    ctx = inp.ctx
    out: list[Finding] = []
    for metric in METRICS:
        if metric not in inp.stats:
            continue
        if metric.startswith("workers.") and "workers.count" in inp.summary.keys:
            continue  # per-worker growth and copy-on-write: the workers rule
        hist = inp.history[metric]
        if ctx.beside_training:
            if inp.cfg.held(hist) == "accumulation":
                out.append(accumulation(ctx.origin, NAME, metric, hist[-1],
                                        hist[-2] if len(hist) >= 2 else None))
            continue
        if ctx.defer_leaks and stairs(inp.history, hist, inp) is None:
            continue
        out.extend(judge_metric(inp, metric, inp.history))
    return out


def stairs(history: Mapping[str, list[EpochStats]], hist: list[EpochStats],
           inp: RuleInput) -> float | None:
    """Two equal stairs held at the last two boundaries (their height), on the metric's own
    series or, for RSS, on the C allocator's in-use bytes (where a boundary's memory shows at
    once, RSS only when the allocator runs out of chunks it kept free); None otherwise."""
    got = inp.cfg.stairs(hist)
    if got is None and hist and hist[-1].metric == "host.rss":
        got = native.in_use_stairs(history, hist, inp.cfg)
    return got


def judge_metric(inp: RuleInput, metric: str,
                 history: Mapping[str, list[EpochStats]]) -> list[Finding]:
    """The verdict on one metric, judged on ``history`` (the check's, or RSS's parts)."""
    ctx, cfg = inp.ctx, inp.cfg
    hist = history[metric]
    cur = hist[-1]
    prev = hist[-2] if len(hist) >= 2 else None
    v = cfg.held(hist)
    stair = stairs(history, hist, inp)
    if v != "leak" and stair is not None:
        v = "leak"  # held stairs on the allocator's in-use bytes (RSS shows them late)
    if v != "leak" and metric == "host.rss" and (native.in_use_held(history, hist, cfg) or
                                                 native.in_use_at_checks_held(history, hist, cfg)):
        v = "leak"  # RSS stalled or its noise was memwatch's own: in-use bytes confirm it
    if v == "leak" and metric == "host.rss":
        found = mapped_file.judge_growth(history, ctx, cfg, inp.mapped_files)
        if found is not None:  # mostly pages of mapped files: the other parts on their own
            parts = mapped_file.parts_history(history)
            out = [f for part in mapped_file.PARTS
                   if part in parts and cfg.held(parts[part]) == "leak"
                   for f in judge_metric(inp, part, parts)]
            if not out and inp.pair is not None:
                # The parts, read in the background, may not show a trend yet (a few reads a
                # unit) while the census already names live objects that explain the rest:
                # library code pages faulted in by the first steps are file-backed too, and
                # must not delay a leak the census has evidence for.
                f = _leak_finding(inp, metric, hist, history, stair)
                if f is not None and f.kind == "leak" and f.culprit and f.rule == NAME:
                    out = [f]  # live objects named: not memory outside them
            return [found, *out]
    if v == "leak" and metric.startswith("host.") and inp.pair is None and \
            ctx.census != "never" and not inp.traced_explains(metric):
        # Host growth without a census at two checks: live objects cannot be asked yet (this
        # check's census was just taken; the next check names the holder). The C allocator's
        # in-use bytes growing with RSS already tell memory handed out and kept from memory the
        # allocator keeps free: said now, unnamed. Without that evidence the verdict waits for
        # the next check. (Unless live traced Python allocations grew by as much: that is user
        # code, named by its allocation site.)
        units = hist[-3:]
        heap = native.heap_growth(history, units) if len(units) >= 2 else None
        if heap is None or not heap.native(units[-1].floor - units[0].floor) or \
                not _past_placement(hist, cfg):
            return []
        return [_unnamed(inp, metric, hist, history, heap)]
    if v == "leak":
        f = _leak_finding(inp, metric, hist, history, stair)
        return [f] if f is not None else []
    if v == "accumulation":
        return [accumulation(ctx.origin, NAME, metric, cur, prev)]
    if (cur.shape == "plateau" or v == "decelerating") and \
            cfg.worth(cur, max(cur.rise, cur.growth)):
        return [plateau(ctx.origin, NAME, metric, cur)]
    if cur.shape == "step" and len(hist) > 1 and cfg.worth(cur, cur.step_height):
        # (a jump in the first unit is warm-up: optimizer state, lazy initialisation)
        return [step_change(ctx.origin, metric, cur)]
    stair = _held_stair(hist)
    if v in ("none", "pending") and stair is not None and cfg.worth(cur, stair):
        return [held_step(ctx.origin, metric, hist, stair)]
    return []


def _between_checks(units: list[EpochStats], pair: CensusPair | None) -> float | None:
    """How much the metric grew between the two censuses of ``pair``, from the closing
    readings of the checks that took them (``units``' last two); None where those readings are
    missing, or the earlier census was not taken at the check that closed ``units[-2]``."""
    if pair is None or len(units) < 2 or pair[1].step - pair[0].step != units[-1].n_steps:
        return None
    return native.at_checks(units[-2], units[-1])


def _past_placement(hist: list[EpochStats], cfg: AnalyzerConfig,
                    without_first: bool = False) -> bool:
    """What a verdict without a holder needs, the series being its evidence: the floor stands
    more than ``cfg.unnamed_min_growth`` above the lowest floor judged (more than where glibc
    places each unit's allocations moves a leak-free run: bounded, either way).

    ``without_first`` (the census found nothing that grew): unless the unit grows steadily
    inside, the floors must also climb without the first unit. Its floor is taken before the
    process's own warm-up (lazy state, the allocators' arenas filled by the first
    accumulation), so a climb from it alone is no evidence when nothing live grew either; a
    leak keeps climbing and is said one check later. The margin is then measured without the
    first unit too: a clean run whose floors creep by half a MiB a unit after its warm-up (what
    the checks' own churn leaves with glibc: ctrl_epoch_accumulation over 8 epochs) passed it
    by the first unit's warm-up alone."""
    steady = hist[-1].shape == "growing"
    since = hist[1:] if without_first and not steady and len(hist) > 2 else hist
    if hist[-1].floor - min(h.floor for h in since) <= cfg.unnamed_min_growth:
        return False
    return not without_first or steady or (len(hist) >= 4 and cfg.held(hist[1:]) == "leak")


def _held_stair(hist: list[EpochStats]) -> float | None:
    """The rise between the two units before this one, when it is far above the noise (four
    thresholds and 2% of the level: the census's "memory kept between units") and this unit
    neither grew inside nor added a quarter of it: memory taken once between two checks (an
    evaluation's outputs kept until the next) and held, flat, since."""
    if len(hist) < 3:
        return None
    a, b, c = hist[-3], hist[-2], hist[-1]
    stair = b.floor - a.floor
    if stair <= max(4 * b.threshold, 0.02 * abs(b.level)) or c.shape != "flat" or \
            b.shape not in ("flat", "step"):
        return None
    return stair if c.floor - b.floor < 0.25 * stair else None


def _rate(hist: list[EpochStats], stair: float | None = None) -> tuple[float, float, float]:
    """The leak's rate (bytes a step) and its interval: the trend's within a growing unit, the
    stairs' over the steps between two boundaries, else from the floors across units."""
    cur = hist[-1]
    if stair is not None and cur.shape != "growing":
        # What a whole period adds, closing to closing: the stair, and what shows of it only
        # in the steps after (RSS rises late where the allocator reused chunks it kept free);
        # never less than the stair itself. Its interval: the two stairs' spread.
        per = _period(hist, stair)
        steps = max(cur.n_steps, 1)
        return per / steps, 0.5 * per / steps, 1.5 * per / steps
    if cur.shape != "growing" and len(hist) >= 2:
        # A floor is where its unit starts (a leak's lowest point): the floors of units -3 and
        # -1 are the steps of units -3 and -2 apart, not of all three.
        first = -3 if len(hist) >= 3 else -2
        steps = sum(h.n_steps for h in hist[first:-1])
        slope = (hist[-1].floor - hist[first].floor) / max(steps, 1)
        return slope, slope * 0.5, slope * 1.5
    return cur.slope, cur.trend.slope_low, cur.trend.slope_high


def _unnamed(inp: RuleInput, metric: str, hist: list[EpochStats],
             history: Mapping[str, list[EpochStats]], heap: native.HeapGrowth) -> Finding:
    """A host leak the C allocator's in-use bytes confirm, before two censuses can name it."""
    ctx, cur = inp.ctx, hist[-1]
    slope = _rate(hist)[0]
    limit = ctx.limit(metric)
    _, steps_to_oom = forecast(metric, inp.summary, cur, slope, limit, history)
    seconds = None if steps_to_oom is None else steps_to_oom * _pace(cur, inp)
    severity = inp.severity(steps_to_oom, cur)
    return native.in_use_leak(
        origin=ctx.origin, metric=metric, units=hist[-3:], slope=slope, heap=heap,
        limit=limit, limit_name=ctx.limit_name(metric), steps_to_oom=steps_to_oom,
        seconds_to_oom=seconds, severity=severity, remaining=ctx.remaining(cur),
        run_known=bool(ctx.total_steps))


def _leak_finding(inp: RuleInput, metric: str, hist: list[EpochStats],
                  history: Mapping[str, list[EpochStats]],
                  stair: float | None = None) -> Finding | None:
    ctx, cfg, pair = inp.ctx, inp.cfg, inp.pair
    cur = hist[-1]
    slope, low, high = _rate(hist, stair)
    limit = ctx.limit(metric)
    peak_now, steps_to_oom = forecast(metric, inp.summary, cur, slope, limit, history)
    seconds_to_oom = None if steps_to_oom is None else steps_to_oom * _pace(cur, inp)
    severity = inp.severity(steps_to_oom, cur)
    # What live objects must explain: the growth over the stretch between the two censuses,
    # at the judged rate (floors), never two point reads of RSS (a busy machine moves those).
    census_steps = pair[1].step - pair[0].step if pair is not None else cur.n_steps
    attribution = inp.attribute(metric, cur, growth=max(slope, 0.0) * max(census_steps, 1))
    # Advice fits the run: a run of checks without epochs is not told "at the epoch end".
    attribution.epochs = not cur.unit.startswith("s") or ctx.partial is not None
    if attribution.own_growth:
        # memwatch's own tracing bookkeeping: nothing of the user's to report.
        log.debug("memwatch: %s grew by %s, memwatch's own while tracing; no finding",
                  metric, attribution.tracemalloc_summary)
        return None
    if attribution.retention and metric.startswith("host.rss"):
        # Live objects explain too little: the C allocator's figures tell native memory from
        # freed memory it keeps (never allocator advice without that evidence).
        # The last two units: the stretch the census pair covers (an earlier unit may still
        # hold the run's warm-up, which no live object explains either).
        units = hist[-2:]
        churn = units[-1].own_churn - units[0].own_churn
        if units[-1].floor - units[0].floor <= churn:
            # No more than memwatch's own checks churned through the heap meanwhile (what a
            # census frees may or may not be reused by the run): no evidence of the run's.
            log.debug("memwatch: %s grew within memwatch's own churn (%s); no finding",
                      metric, fmt_bytes(churn))
            return None
        between = _between_checks(units, pair)
        if between is not None and between <= units[-1].resolution:
            # RSS did not grow between the two censuses' checks: the growth the floors show
            # came before the first census (a leak that stopped; the earlier verdict, which
            # named its holder, is what the belief keeps), so nothing is left for live objects
            # to explain, and no native memory or retention to claim in their place.
            log.debug("memwatch: %s grew by %s between the censuses' checks; no finding",
                      metric, fmt_bytes(between))
            return None
        if not _past_placement(hist, cfg, without_first=True):
            log.debug("memwatch: %s: no object explains its growth, still within glibc's "
                      "placement; no finding yet", metric)
            return None
        return native.native_or_retention(
            origin=ctx.origin, metric=metric, units=units, slope=slope,
            rss_growth=units[-1].floor - units[0].floor,
            heap=native.heap_growth(history, units) if len(units) >= 2 else None,
            attribution=attribution, limit=limit, limit_name=ctx.limit_name(metric),
            steps_to_oom=steps_to_oom, seconds_to_oom=seconds_to_oom, severity=severity,
            remaining=ctx.remaining(cur), run_known=bool(ctx.total_steps))
    if _optimizer_state(attribution):
        return held_optimizer_state(ctx.origin, metric, hist, attribution)
    filling = bounded.to_bound(origin=ctx.origin, metric=metric, a=attribution,
                               growth=max(slope, 0.0) * max(census_steps, 1), slope=slope,
                               peak_now=peak_now, limit=limit,
                               limit_name=ctx.limit_name(metric))
    if filling is not None:  # the holder carries its own bound, and it fits: a plateau to come
        return filling
    return _message(origin=ctx.origin, metric=metric, stats=hist, slope=slope,
                    slope_ci=(low, high), limit=limit, peak_now=peak_now,
                    steps_to_oom=steps_to_oom, seconds_to_oom=seconds_to_oom,
                    severity=severity, attribution=attribution,
                    remaining=ctx.remaining(cur), run_known=bool(ctx.total_steps),
                    limit_name=ctx.limit_name(metric), stair=stair)


def _period(hist: list[EpochStats], stair: float) -> float:
    """Bytes one period between two boundaries adds: the closing readings' rise per unit over
    every period since the stairs began (each stair and whatever followed it in its unit's
    steps), at least ``stair``.

    RSS shows a period's memory when the allocator runs out of chunks it kept free, so one
    period's closing-to-closing rise swings with that timing: an evaluation keeping 8 MiB of
    logits raised RSS by 8 MiB a period in some runs, 16 in others, and by 8, 8, 16.7, 8, 8 in
    one, where a mean over the last three periods (8.0) was 34% under the run's (10.4). A jump
    of one allocator region is spread over every period the baseline holds, so the baseline is
    as long as the leak: back from the last closing while each period added at least half a
    stair (a period that added less was before the leak began, or is not its period)."""
    known = [(i, h.closing) for i, h in enumerate(hist) if h.closing is not None]
    if len(known) < 2 or known[-1][0] != len(hist) - 1:
        return stair
    first = len(known) - 1
    while first > 0:
        (i0, c0), (i1, c1) = known[first - 1], known[first]
        if c1 - c0 < 0.5 * stair * (i1 - i0):
            break
        first -= 1
    if first == len(known) - 1:
        return stair
    (i0, c0), (i1, c1) = known[first], known[-1]
    return max(stair, (c1 - c0) / (i1 - i0))


def _pace(cur: EpochStats, inp: RuleInput) -> float:
    """Wall seconds per optimizer step a forecast in time counts with: the run's pace
    (evaluations and checks included) when the session measured it, else the unit's."""
    return inp.ctx.seconds_per_step or cur.seconds_per_step


# --------------------------------------------------------------------------- wording

def _at(cur: EpochStats) -> str:
    """Where a unit's stair came: "every evaluation", "every epoch end", "every check"."""
    if cur.after in ("val", "test", "predict"):
        return "every evaluation"
    return "every check" if cur.unit.startswith("s") else "every epoch end"

def _message(*, origin: Origin, metric: str, stats: list[EpochStats], slope: float,
         slope_ci: tuple[float, float], limit: float | None, peak_now: float,
         steps_to_oom: float | None, seconds_to_oom: float | None, severity: Severity,
         attribution: Attribution, remaining: float, run_known: bool,
         limit_name: str | None = None, stair: float | None = None) -> Finding:
    cur = stats[-1]
    n_ep = sum(1 for s in stats if s.shape == "growing") or 1
    culprit, suggestions, detail = culprit_of(metric, attribution)
    if stair is not None and cur.shape != "growing":
        per = _period(stats, stair)
        more = (f" (with what shows in the steps after it, {fmt_bytes(per)})"
                if per > 1.1 * stair else "")
        msg = (f"{where(metric)} rises by {fmt_bytes(stair)} at {_at(cur)} and keeps it: two "
               f"equal stairs in a row, the first still held. Every {cur.n_steps:,} steps it "
               f"adds {fmt_bytes(stair)}{more}, {fmt_bytes(slope)} per step.")
    else:
        msg = (
            f"{where(metric)} grows by {fmt_bytes(slope)} per step ({ci(slope_ci)}) and is not "
            f"released: its floor rose by {fmt_bytes(cur.floor - stats[0].floor)} "
            f"(to {fmt_bytes(cur.floor)}) {span(stats)}."
        )
    msg += forecast_words(limit, steps_to_oom, seconds_to_oom, severity, remaining, run_known,
                          limit_name)
    if detail:
        msg += " " + detail
    evidence = {
        "slope_bytes_per_step": slope,
        "slope_ci_low": slope_ci[0],
        "slope_ci_high": slope_ci[1],
        "mann_kendall_p": cur.trend.p,
        "mann_kendall_z": cur.trend.z,
        "lag1_autocorrelation": cur.trend.r1,
        "epoch_floors": [s.floor for s in stats[-6:]],
        "epoch_peaks": [s.peak for s in stats[-6:]],
        "epochs_growing": n_ep,
        "limit_bytes": limit,
        "limit_name": limit_name,
        "peak_bytes": peak_now,
        **attribution.evidence(),
        "remaining_steps": remaining,
    }
    if stair is not None:
        evidence.update(pattern="stairs", stair_bytes=stair, stair_at=_at(cur),
                        period_bytes=_period(stats, stair), steps_between_stairs=cur.n_steps)
    return origin.finding(rule=NAME, kind="leak", metric=metric, severity=severity, message=msg,
                          bytes_per_step=slope, steps_to_oom=steps_to_oom,
                          seconds_to_oom=seconds_to_oom, culprit=culprit,
                          suggestions=suggestions, evidence=evidence)


def step_change(origin: Origin, metric: str, cur: EpochStats) -> Finding:
    return benign(origin, NAME, "step_change", metric, (
        f"{where(metric)} jumped once by {fmt_bytes(cur.step_height)} around step "
        f"{cur.step_at} and stayed flat before and after: a buffer allocated once (optimizer "
        "state, a cache sized at first use). Not a leak unless it repeats."),
        height=cur.step_height, at_step=cur.step_at)


def held_step(origin: Origin, metric: str, hist: list[EpochStats], stair: float) -> Finding:
    return benign(origin, NAME, "step_change", metric, (
        f"{where(metric)} rose once by {fmt_bytes(stair)} between two checks "
        f"({fmt_bytes(hist[-3].floor)} → {fmt_bytes(hist[-2].floor)}) and has stayed flat "
        "since: memory taken once and held, such as an evaluation's outputs kept until the next "
        "one or a cache sized at first use. Bounded; not a leak unless it repeats."),
        height=stair, floors=[h.floor for h in hist[-3:]])


def _optimizer_state(a: Attribution) -> bool:
    """What grew between the censuses is held by a torch optimizer's per-parameter state while
    no parameter was added (no new leaf tensor that requires grad). ``torch.optim`` creates
    that state at each parameter's first step and updates it in place after: its size is a
    fixed multiple of the parameters' (two for Adam), so growth held there is a step change
    (an optimizer created or swapped late, layers unfrozen mid-run, state loaded on resume),
    bounded whatever the run length. New parameters, or optimizers that accumulate (a growing
    container above the optimizer: see :mod:`..culprits.holders`), make it a leak again."""
    h = a.holder
    if h is None or not h.optimizer_state:
        return False
    return not any(g.get("requires_grad") and g.get("grad_fn") is None and
                   g.get("count_delta", 0) > 0 for g in a.growing_groups)


def held_optimizer_state(origin: Origin, metric: str, hist: list[EpochStats],
                         a: Attribution) -> Finding:
    h = a.holder
    assert h is not None
    grew = a.chosen.bytes if a.chosen is not None else 0.0
    return benign(origin, NAME, "step_change", metric, (
        f"{where(metric)} rose by {fmt_bytes(hist[-1].floor - hist[0].floor)} {span(hist)}; "
        f"what live objects gained is held by an optimizer's per-parameter state "
        f"(`{h.path}`, +{fmt_bytes(grew)}), which torch.optim creates at each parameter's "
        "first step and keeps at a fixed multiple of the parameters' size: an optimizer "
        "created or swapped late, or layers unfrozen, not a leak. It would be one if "
        "parameters kept being added."),
        height=hist[-1].floor - hist[0].floor, holder=h.path, holder_optimizer_state=True,
        culprit_bytes=grew, floors=[x.floor for x in hist[-3:]])


RULE: Rule[RuleInput] = Rule(
    name=NAME,
    kinds=frozenset({"leak", "accumulation", "plateau", "step_change", "allocator_retention",
                     "mapped_file"}),
    once=frozenset({"accumulation", "plateau", "mapped_file"}),
    judge=judge,
    reads=METRICS,
    parts=(mapped_file.PART, native.PART, bounded.PART, BELIEF),
)
