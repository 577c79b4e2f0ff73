"""The analyzer: at every check, per metric, a verdict with evidence. It only orchestrates.

Method (see docs/findings.md):

1. Per metric and unit (an epoch, or the stretch between two checks), statistics on bucket
   floors (:mod:`.stats.shapes`): a robust trend (Mann–Kendall with autocorrelation correction,
   Theil–Sen with a confidence interval), a single-jump test and a saturation test classify the
   unit as flat, growing, plateau or step. Which units a verdict compares is decided here.
2. A census of live objects when the series gives a reason (through the :class:`Evidence`
   port), so that the next verdict can diff two of them and name the culprit and its holder.
3. The rules of :data:`memwatch.analysis.rules.RULES`, in order, each a function of one
   :class:`~memwatch.analysis.rules.base.RuleInput`; their findings pass the one
   de-duplication policy (:func:`~memwatch.analysis.rules.base.dedupe`).
4. The beliefs (:mod:`.beliefs`): every finding names the belief it states, and the leak
   beliefs this check said nothing new about are weighed again (growth that stopped).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Protocol

from memwatch.analysis.beliefs import Beliefs
from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.evidence import CensusPair, Evidence
from memwatch.analysis.rules import RULES, Rule, RuleInput, dedupe
from memwatch.analysis.rules.leak.native import IN_USE
from memwatch.analysis.stats.held import SIMILAR, floor_rose
from memwatch.analysis.stats.settle import workers_settled_step
from memwatch.analysis.stats.shapes import EpochStats, epoch_stats, last_value, read_noise
from memwatch.core.findings import Finding
from memwatch.timeline import EpochSummary
from memwatch.timeline.summary import merge

log = logging.getLogger("memwatch")


class Judge(Protocol):
    """What judges a session's checks: :class:`Analyzer`, or any object with its ``check``
    (``MemWatch.analyzer`` may be replaced by one)."""

    def check(self, summary: EpochSummary, ctx: CheckContext) -> list[Finding]: ...

# Metrics judged for leaks; the others are evidence.
LEAK_METRICS = ("device.allocated", "host.rss", "workers.uss")
# This process's host memory, which memwatch's own work at checks adds to (judged without it).
_OWN_GROWTH = ("host.rss", "host.rss_anon", "host.uss", "host.pss")
#: How far the own-growth correction may be off, as a share of the growth it took out since the
#: previous check. It is RSS measured before and after each check: exact to about 2% in a loop
#: that allocates little between checks, but in one that churns 1 MiB arrays the allocator
#: reuses memory a check left free and moves the rest, and 22% and 30% of the correction
#: showed up as floor growth over the next two epochs (then none, once memwatch's own footprint
#: had settled). Growth within this margin is memwatch's as much as the run's: the unit's
#: threshold is raised to it.
OWN_UNCERTAINTY = 0.5
# Metrics whose growth live objects may explain: a census is worth taking when they grow.
_SUSPECTS = ("device.allocated", "host.rss", "host.rss_anon", "host.malloc_in_use")
# The leak metrics, plus the ones their verdicts and forecasts lean on.
_JUDGED = ("device.allocated", "device.reserved", "device.peak", "host.rss", "workers.uss",
           "workers.rss", "workers.count", "host.rss_anon", "host.rss_file", "host.rss_shmem",
           "device.outside_allocator", "host.malloc_in_use", "host.malloc_free")


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

    def __init__(self, config: AnalyzerConfig | None = None, evidence: Evidence | None = None,
                 rules: tuple[Rule[RuleInput], ...] = RULES,
                 beliefs: Beliefs | None = None) -> None:
        self.config = config or AnalyzerConfig()
        if evidence is None:
            from memwatch.analysis.culprits.live import LiveEvidence

            evidence = LiveEvidence()
        #: The port through which the analyzer and its rules read the live process.
        self.evidence: Evidence = evidence
        #: The rules each check runs, in order.
        self.rules = rules
        #: One belief per suspected leak (and per shape of a metric), revised at every check:
        #: every finding leaves :meth:`check` naming its belief.
        self.beliefs = beliefs if beliefs is not None else Beliefs()
        self.history: dict[str, list[EpochStats]] = {}
        self._said: set[tuple[str, ...]] = set()
        #: Per metric, the segments of the first epoch (or of a run without epochs) so far.
        self.segments: dict[str, list[EpochStats]] = {}
        #: memwatch's own growth (``ctx.own_growth``) at the previous check.
        self._own_judged = 0.0
        #: memwatch's own churn at this check (``ctx.own_churn``), recorded in host stats.
        self._churn_now = 0.0
        #: Censuses taken so far (the first one is the baseline every later verdict diffs).
        self.censuses = 0
        # Worker memory warms up for longer (lazy page faults of shared libraries, copy-on-write,
        # prefetch buffers) and its level is small: ask for 1% of the level per epoch.
        self._worker_shape = dataclasses.replace(
            self.config.shape, min_growth_rel=max(self.config.shape.min_growth_rel, 0.01))
        #: host.rss's stats of the summary judged last (the swing its parts' readings lie in).
        self._rss_of: tuple[EpochSummary, bool, EpochStats | None] | None = None
        #: The previous check inside the first epoch left its leak verdicts to a later one.
        self._deferred = False
        #: The summary of the last segment judged (a short last stretch is judged with it).
        self._last_segment: EpochSummary | None = None

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
        self._churn_now = ctx.own_churn
        if ctx.at == "epoch_end":
            stats = self._add(summary, self.history, ctx)
            self.segments = {}  # the epoch's segments are in its stats now
            self._last_segment = None
            judged = self.history
        else:
            last = self._short_tail(summary, ctx)
            if last is not None:
                # The last word after a check that deferred its leak verdicts, on a stretch
                # too short to be judged as a unit: judged with that check's unit, as one.
                for units in self.segments.values():
                    del units[-1:]
                summary = merge(last, summary)
            self._last_segment = summary
            seg_stats = self._add(summary, self.segments, ctx, first=not self.history)
            stats, judged = {}, {}
            for m, seg in seg_stats.items():
                closed = self.history.get(m, [])
                if not closed or ctx.partial is None:
                    stats[m], judged[m] = seg, self.segments[m]
                elif closed[-1].shape == "growing":
                    # Closed epochs grew inside (and, unless a leak was reported, let it go):
                    # only the epoch as a whole tells a leak from that accumulation.
                    st = self._stats(ctx.partial, m, ctx, first=False)
                    if st is not None:
                        stats[m], judged[m] = st, [*closed, st]
                else:
                    # Closed epochs were flat inside: this epoch's segments, after them.
                    stats[m], judged[m] = seg, [*closed[-2:], *self.segments[m]]

        self._own_judged = ctx.own_growth
        self._deferred = ctx.defer_leaks and ctx.at == "interval"
        pair = self._maybe_census(summary, ctx, self._census_reason(stats, judged))

        inp = RuleInput(summary=summary, history=judged, stats=stats, ctx=ctx, cfg=cfg,
                        evidence=self.evidence, pair=pair)
        found: list[tuple[Rule[RuleInput], Finding]] = []
        for rule in self.rules:
            found.extend((rule, f) for f in rule.judge(inp))
        return self.beliefs.revise(dedupe(found, self._said), inp)

    def _short_tail(self, summary: EpochSummary, ctx: CheckContext) -> EpochSummary | None:
        """The last word at close (``at="final"``) comes on a stretch too short to be judged
        on its own, after a check that left leak verdicts to a later one (a check sized to a
        run nobody said the length of, before any epoch ended). Too short: fewer steps than
        :data:`~memwatch.analysis.stats.held.SIMILAR` times the previous unit's, where a
        steady leak's rise cannot match the previous unit's (floors that climb by similar
        amounts), and the C allocator's free chunks hide a few steps' growth from RSS. A
        1,200-step loop checked at steps 100 and 1,180 is judged on steps 100-1,200, not on
        the last 20 alone. The previous segment's summary when so, else None."""
        last = self._last_segment
        if ctx.at != "final" or not self._deferred or self.history or last is None:
            return None
        return last if summary.n_steps < SIMILAR * last.n_steps else None

    def sensitivity(self) -> dict[str, float]:
        """Per leak metric, the smallest growth (bytes a step) the last unit judged would count:
        its threshold (the largest of the magnitude floors and four times the floors' noise,
        measured on that unit) over its steps. A leak needs that at two checks in a row."""
        out: dict[str, float] = {}
        for m in (*LEAK_METRICS, "host.rss_anon"):
            hist = self.segments.get(m) or self.history.get(m)
            if hist:
                out[m] = hist[-1].threshold / max(hist[-1].n_steps, 1)
        return out

    @property
    def last_census_ms(self) -> float | None:
        """Milliseconds the last census took (None until one ran, or when the evidence port
        does not time its censuses)."""
        return getattr(self.evidence, "last_census_ms", None)

    def _host_read_noise(self, summary: EpochSummary, metric: str, ctx: CheckContext,
                         first: bool) -> float:
        """The noise a part of host memory read in the background carries in ``summary``
        (:func:`~memwatch.analysis.stats.shapes.read_noise`): its readings lie anywhere in
        ``host.rss``'s swing over the unit (peak less floor, less the unit's held rise), which
        the per-step RSS sample measures. 0 for a metric read with every sample, and for the
        C allocator's in-use bytes: they are no part of RSS (RSS's swing at the per-step
        sample is mostly the allocator taking and returning pages, which they do not count),
        and every reading of theirs is taken at a step's sample, where the loop's temporaries
        are freed (:meth:`memwatch.session.sampling.Sampling._at_step`): readings of what the
        loop keeps, comparable with each other (a validation's 4 MiB tensor kept each epoch
        reads as stairs of 3.73 MiB equal to 0.02 MiB, where RSS's swing in the first epoch
        had given them a noise of 2.3 MiB and hidden the first stair)."""
        reads = summary.reads(metric)
        if reads is None or not metric.startswith("host.") or metric in ("host.rss", IN_USE):
            return 0.0
        memo = self._rss_of
        if memo is None or memo[0] is not summary or memo[1] != first:
            rss = self._stats(summary, "host.rss", ctx, first)
            memo = self._rss_of = (summary, first, rss)
        rss = memo[2]
        if rss is None:
            return 0.0
        return read_noise(rss.peak - rss.floor - max(rss.rise, 0.0), reads)

    def _stats(self, summary: EpochSummary, metric: str, ctx: CheckContext,
               first: bool) -> EpochStats | None:
        """``metric``'s statistics over ``summary``, with this check's closing reading (less
        the offset its levels were lowered by) and what ran after the unit's last step, when
        the check closes a boundary (an epoch's end, or an evaluation that ran since the last
        step). A check inside an epoch with nothing run since the last step is no boundary:
        its reading above the unit's end floor is the unit's own growth over its last tenth
        (steady growth would read as equal stairs at every such check), so no stair is read."""
        st = self._stats_of(summary, metric, ctx, first)
        closing = ctx.closing.get(metric)
        boundary = ctx.at != "interval" or ctx.after is not None
        if st is not None and boundary and closing is not None and math.isfinite(closing):
            offset = ctx.own_growth if metric in _OWN_GROWTH else \
                ctx.own_in_use if metric == IN_USE else 0.0
            st.closing = float(closing) - offset
            st.after = ctx.after
        return st

    def _stats_of(self, summary: EpochSummary, metric: str, ctx: CheckContext,
                  first: bool) -> EpochStats | None:
        noise = self._host_read_noise(summary, metric, ctx, first)
        if metric in _OWN_GROWTH:
            offset = ctx.own_growth
            st = epoch_stats(summary, metric, self.config.shape, first_epoch=first,
                             offset=offset, noise_floor=noise)
            if st is not None:
                own_step = max(offset - self._own_judged, 0.0)
                st.own_free_threshold = st.threshold
                st.threshold = max(st.threshold, OWN_UNCERTAINTY * own_step)
                st.own_churn = self._churn_now
            return st
        if metric == IN_USE:
            # What memwatch's checks left handed out (a census's baseline, findings,
            # reports), measured exactly by the same counters around each check: not the
            # run's.
            return epoch_stats(summary, metric, self.config.shape, first_epoch=first,
                               offset=ctx.own_in_use, noise_floor=noise)
        if metric.startswith("workers.") and metric != "workers.count":
            # From where every worker of the unit was up: their start-up is no evidence about
            # their memory. (The count itself is judged over the whole unit: its floor there
            # is what the workers_count rule reads.)
            start = workers_settled_step(summary, self._worker_shape.min_growth_bytes)
            return epoch_stats(summary, metric, self._worker_shape, first_epoch=first,
                               start_step=start)
        return epoch_stats(summary, metric, self.config.shape, first_epoch=first,
                           noise_floor=noise)

    def _add(self, summary: EpochSummary, into: dict[str, list[EpochStats]],
             ctx: CheckContext, first: bool | None = None) -> dict[str, EpochStats]:
        """Stats of every judged metric of ``summary``, appended to ``into`` (bounded)."""
        out: dict[str, EpochStats] = {}
        for metric in summary.keys:
            if metric not in _JUDGED:
                continue
            hist = into.setdefault(metric, [])
            st = self._stats(summary, metric, ctx,
                             first=not hist if first is None else first and not hist)
            if st is None:
                continue
            hist.append(st)
            del hist[:-16]  # bounded: verdicts look back a few units only
            out[metric] = st
        return out

    # ------------------------------------------------------------------ census scheduling
    def _census_reason(self, stats: dict[str, EpochStats],
                       judged: dict[str, list[EpochStats]]) -> str | None:
        """Why a census is worth its cost now (None: no reason).

        * ``"verdict"``: a leak metric's growth is held at this check (a leak verdict to
          name: its holder needs this census and the previous one);
        * ``"growing"``: a leak metric grows steadily in this unit, or, from the third unit
          on, its floor sits above the previous unit's by far more than the noise (four
          thresholds and 2% of its level: memory kept between units, by validation or
          epoch-end hooks, rises in such stairs), or the check's closing reading stands that
          far above the unit's end floor (a boundary's stair, which the next may confirm).
          The census at the check *before* a verdict is the baseline the verdict diffs; a
          warm-up levels off, so it is a plateau or a small step, not steady growth;
        * ``"hint"``: a weaker sign (a jump, a floor above the previous unit's, the second
          unit's stair over the first, whose floor predates the warm-up, a rise within the
          unit), or growth of a part of RSS or of the allocator's in-use bytes alone (their
          warm-up stairs come with every clean run's first epochs; RSS itself tells a leak's
          growth, and their own verdicts still ask for a census): worth a census only within
          the cost budget, the run's first census excepted (the baseline).
        """
        reason = None
        for m in _SUSPECTS:
            st, hist = stats.get(m), judged.get(m, [])
            if st is None:
                continue
            if len(hist) >= 2 and self.config.held(hist) == "leak":
                return "verdict"
            held = hist[-1].floor - hist[-2].floor if len(hist) >= 2 else 0.0
            stair = held > max(4 * st.threshold, 0.02 * abs(st.level))
            # Above the first unit's floor is where every run's warm-up ends (the first
            # unit's floor predates the optimizer's state, the allocator's caches, the
            # prefetch; a clean Lightning fit's RSS floor rose 36 MiB from epoch 0 to 1):
            # a hint then, a stair from the third unit on.
            # A boundary's stair (the closing reading above the unit's end floor): the next
            # boundary may confirm it, and that verdict diffs against this census.
            kept = st.stair if st.stair is not None else 0.0
            boundary = kept > max(4 * st.threshold, 0.02 * abs(st.level))
            if m in LEAK_METRICS and (st.shape == "growing" or stair and len(hist) >= 3
                                      or boundary):
                reason = "growing"
            elif reason is None and (st.shape == "step" or st.rise > st.threshold
                                     or stair or floor_rose(hist) or kept > st.threshold):
                reason = "hint"
        return reason

    def _maybe_census(self, summary: EpochSummary, ctx: CheckContext,
                      reason: str | None) -> CensusPair | None:
        """A census now? ``always``: yes; ``never``: no; ``auto``: when the series gives a reason
        (:meth:`_census_reason`) — a verdict to name or steady growth always (the diagnosis is
        worth its cost), a weaker hint only within the session's cost budget (its estimate, in
        CPU seconds: objects to walk times this run's measured CPU seconds per object; never
        how long the last check took) once a first census exists. The first is the baseline:
        a leak whose first unit showed only weak signs reaches its verdict at the next check,
        and without a census before it that verdict cannot name its holder (issue 23's timing
        goal; a budget that left the baseline out of 4-s-epoch runs named three of the test
        suite's leaks one check late). One census per clean run, 0.1-0.2 CPU s on a
        framework's heap. A clean run with a flat series takes none."""
        if ctx.census in ("never", "skip"):
            return None
        cap: int | None = None
        if ctx.census == "auto" and reason != "verdict":
            # Growth alone: worth a census unless the heap is past census_max_objects (then
            # only a verdict to name takes one); a hint only within the budget. A count not
            # known without listing the heap is the census's to find (it lists it anyway).
            cap = self.config.census_max_objects
            if reason is None or not self.config.census_when_suspected:
                return None
            n = self.evidence.object_count(at_most=cap)
            if n is not None and n > cap:
                return None
            if reason == "hint" and self.censuses and ctx.budget is not None and \
                    not ctx.budget(self.evidence.census_cost()):
                return None
        # A full gc.collect() is half a census's cost (0.18 of 0.35 CPU s on 360,000 objects):
        # taken before a census a verdict diffs against the previous one, where garbage that
        # cycles keep would be counted as held. An earlier census is only the baseline of a
        # later diff: garbage in it can only make growth look smaller, never name a holder.
        # The tracemalloc snapshot of this check ran gc.collect() a moment ago; while tracing,
        # its allocation sites replace the per-type object counts (see take_census).
        collect = not ctx.collected and (reason == "verdict" or ctx.census == "always")
        rss = last_value(summary, "host.rss")
        pair = self.evidence.census(collect=collect, count_types=not ctx.tracing,
                                    epoch=summary.epoch, step=summary.end_step,
                                    rss=float("nan") if rss is None else rss, at_most=cap)
        if cap is None or (self.evidence.object_count(at_most=cap) or 0) <= cap:
            self.censuses += 1  # (not when the heap turned out past the cap: none was taken)
        return pair


__all__ = ["LEAK_METRICS", "Analyzer", "AnalyzerConfig", "CheckContext", "Judge"]
