"""Checks: where a session turns its samples into verdicts.

:class:`Checker` owns the analyzer, the allocation tracer (``tracemalloc=``), the cross-rank
exchange and the findings so far, and runs the verdicts of every check: at an epoch end, every
``check_every_n_steps`` steps and every ``check_every_s`` seconds. A check builds the
:class:`memwatch.analysis.CheckContext` the analyzer is told (the analyzer never reads the
session), asks for the verdicts, exchanges per-rank summaries and returns one
:class:`memwatch.core.protocols.CheckReport`, which the session hands on (the watchdog, the
sinks, the console, the schedule). Every finding is born here complete
(:class:`memwatch.core.findings.Origin`). What memwatch's own work at a check leaves in the
process (:meth:`Checker.own_work`) is measured here too: the next verdicts judge the run without
it.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from memwatch.analysis.context import CheckContext
from memwatch.core.costs import Costs
from memwatch.core.findings import Finding, Origin
from memwatch.core.protocols import CheckReport, SessionView
from memwatch.session.config import CHECK_CAP_STEPS, WatchConfig
from memwatch.session.faults import Faults
from memwatch.session.plan import RunPlan
from memwatch.session.sampling import Sampling
from memwatch.timeline import EpochSummary

if TYPE_CHECKING:
    from memwatch.analysis.analyzer import Judge
    from memwatch.analysis.culprits.census.allocations import AllocationTracer
    from memwatch.runtime.exchange import RankExchange

log = logging.getLogger("memwatch")

__all__ = ["MAX_FINDINGS", "Checker"]

#: ``MemWatch.findings`` keeps at most this many (the most recent).
MAX_FINDINGS = 1000
#: The run's pace is measured over the periods between this many checks (two periods: a leak's
#: verdict compares two units).
PACE_CHECKS = 3


class Checker:
    """The analyzer, tracer, rank exchange and findings of one session.

    Attributes:
        analyzer: the analyzer (None when ``analyze=False`` or it failed to start); any object
            with ``check(summary, context) -> list[Finding]`` may replace it
            (:meth:`use_analyzer`).
        findings: every finding so far (the latest :data:`MAX_FINDINGS`).
        checks: checks run so far (epoch ends and checks inside epochs).
        rank: this process's ``rank``/``world_size``; job: which job it belongs to.
        rank_summaries: on rank 0 after a check with an exchange, one summary per rank (None
            for a rank that did not answer); empty otherwise, so loggers never log the same
            figures twice. rank_last_seen: each rank's latest summary ever received.
    """

    def __init__(self, config: WatchConfig, view: SessionView, faults: Faults,
                 sampling: Sampling, plan: RunPlan, costs: Costs | None = None) -> None:
        from memwatch.runtime.exchange import rank_info

        self._config = config
        self._view = view
        self._faults = faults
        self._sampling = sampling
        self._plan = plan
        self._costs = costs if costs is not None else Costs()
        self.analyzer: Judge | None = None
        self.findings: list[Finding] = []
        self.checks = 0
        self.rank: dict[str, int] = rank_info()
        self.job: dict[str, Any] = {"id": None, "source": None, "attempt": None}
        self.rank_summaries: list[dict[str, Any] | None] = []
        self.rank_last_seen: list[dict[str, Any] | None] = []
        #: RSS memwatch's own checks left behind so far (bytes): the analyzer judges this
        #: process's memory without it.
        self.own_rss = 0.0
        #: RSS the checks added while they ran, freed-back memory included (see own_churn).
        self.own_churn = 0.0
        #: The C allocator's in-use bytes the checks left handed out (see check()).
        self.own_in_use = 0.0
        self.tracer: AllocationTracer | None = None  # while tracing
        self.exchange: RankExchange | None = None  # when distributed
        #: An evaluation loop judged beside a training session of this process (its memory
        #: kept across evaluations is the training session's to judge).
        self.beside_training = False
        #: What ran since the last step and before the next check ("val": an evaluation).
        self.after: str | None = None
        #: An evaluation boundary was passed once: the loop evaluates (see check()).
        self.evaluates = False
        #: Where the run's pace is measured from: the first unit judged, then the checks (time,
        #: step) of the last two periods.
        self.pace_from: tuple[float, int] | None = None
        self.marks: collections.deque[tuple[float, int]] = collections.deque(maxlen=PACE_CHECKS)

    # ------------------------------------------------------------------ start and stop
    def start(self) -> None:
        """The analyzer, the rank exchange and the tracer, as configured."""
        if self._config.analyze:
            self.start_analyzer()
        self._start_exchange()
        if self._config.tracemalloc_frames:
            self._start_tracer()

    def start_analyzer(self) -> None:
        try:
            from memwatch.analysis import Analyzer
            from memwatch.analysis.culprits.live import LiveEvidence
            from memwatch.bundle.paths import OutputPaths

            cfg = self._config
            # DataLoader workers answer censuses of their own to the training session
            workers = str(OutputPaths.resolve(cfg.out_dir).workers) \
                if cfg.workers and cfg.stage == "train" else None
            self.analyzer = Analyzer(cfg.analyzer_config, evidence=LiveEvidence(
                self._costs, workers_dir=workers, share=cfg.share))
        except Exception as e:  # noqa: BLE001
            self._faults.disable("analyzer", e)

    def use_analyzer(self, analyzer: Judge | None) -> None:
        """Judge with ``analyzer`` from now on (None: no verdicts)."""
        self.analyzer = analyzer

    def judge_beside_training(self, beside: bool = True) -> None:
        """This (evaluation) session runs beside a training session of the same process: what
        its memory keeps across evaluations is that session's to judge."""
        self.beside_training = bool(beside)

    def passed(self, what: str) -> None:
        """``what`` ran since the last step ("val": an evaluation loop); the next check's closing
        reading includes what it kept."""
        self.after = what
        self.evaluates = True

    def current(self) -> list[Finding]:
        """The current state of every belief: the latest finding of each (see
        :func:`memwatch.analysis.beliefs.current`)."""
        from memwatch.analysis.beliefs import current

        return current(self.findings)

    def _start_exchange(self) -> None:
        """Per-rank summaries at checks (never per step) when running distributed."""
        from memwatch.runtime.exchange import RankExchange, dist_ready, job_identity, rank_info

        self.rank = rank_info()  # torch.distributed may have been initialised after __init__
        try:
            self.job = job_identity()
        except Exception:  # noqa: BLE001 - an odd environment must not stop the run
            pass
        if self._config.distributed == "off":
            return
        dist = dist_ready()
        if dist is None:
            return
        try:
            self.exchange = RankExchange(dist, float(self._config.exchange_timeout_s), self.job)
            self.job = self.exchange.job
        except Exception as e:  # noqa: BLE001
            self._faults.disable("rank exchange", e)

    def _start_tracer(self) -> None:
        if self.analyzer is None:
            log.info("memwatch: tracemalloc=%r does nothing without the analyzer (analyze=False "
                     "or it failed to start): only the analyzer reads it; not tracing",
                     self._config.tracemalloc_frames)
            return
        try:
            from memwatch.analysis.culprits.census.allocations import AllocationTracer

            self.tracer = AllocationTracer(self._config.tracemalloc_frames).start()
        except Exception as e:  # noqa: BLE001
            self.tracer = None
            self._faults.disable("tracemalloc", e)

    def stop_tracer(self, exc: BaseException | None = None) -> None:
        tracer, self.tracer = self.tracer, None
        if exc is not None:
            self._faults.disable("tracemalloc", exc)
        if tracer is None:
            return
        try:
            tracer.close()
        except Exception:  # noqa: BLE001
            log.debug("memwatch: tracemalloc failed to stop", exc_info=True)

    def after_fork_in_child(self) -> None:
        """tracemalloc that memwatch started: nothing reads it in a forked child."""
        if self.tracer is not None:
            self.tracer = None
            from memwatch.analysis.culprits.census.allocations import after_fork_in_child

            after_fork_in_child()

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()
        if self.tracer is not None:
            self.stop_tracer()

    # ------------------------------------------------------------------ checks
    def interval_summary(self) -> tuple[EpochSummary, EpochSummary | None] | None:
        """What a check inside the epoch judges: the segment since the previous check and,
        once an epoch ended, the epoch so far; None when there is nothing to judge (no
        analyzer, an empty segment)."""
        tl = self._sampling.timeline
        if tl is None or self.analyzer is None or "analyzer" in self._faults:
            return None
        try:
            summary = tl.end_segment()
            partial = tl.epoch_so_far() if tl.epochs else None
        except Exception as e:  # noqa: BLE001
            self._faults.disable("segment summary", e)
            return None
        return None if summary is None else (summary, partial)

    @contextmanager
    def own_work(self) -> Iterator[None]:
        """Measure what memwatch's own work inside (a check and what it hands on: a census, a
        snapshot, the verdicts, the sinks' reports) leaves in this process: the next units are
        judged without it, and its time counts as the ``verdicts`` cost."""
        t0, before = time.perf_counter(), self._inside()
        c0, before_cpu = time.thread_time(), self._inside(self._costs.cpu)
        rss0, free0, used0 = self._sampling.footprint()
        try:
            yield
        finally:
            rss1, free1, used1 = self._sampling.footprint()
            if used0 is not None and used1 is not None:
                # What the check left handed out by the C allocator (a census's baseline, the
                # findings, the reports): the run's in-use bytes are judged without it. What a
                # check's gc.collect() freed of the run's garbage comes off it (the run's own
                # collector would have freed it too).
                self.own_in_use = max(self.own_in_use + used1 - used0, 0.0)
            if rss0 is not None and rss1 is not None:
                # What memwatch's own work at this check (a census, a snapshot, the verdicts,
                # the sinks' reports) left in RSS: not the run's growth. The
                # next units are judged without it. What the check freed back to the C
                # allocator stays in RSS but is not memwatch's: the run's next allocations
                # reuse it (a census of a growing autograd graph frees more every check).
                kept = rss1 - rss0
                self.own_churn += max(kept, 0.0)
                if free0 is not None and free1 is not None:
                    kept -= max(free1 - free0, 0.0)
                self.own_rss = max(self.own_rss + kept, 0.0)
            # What the parts the check ran did not count themselves (census, holders, the
            # tracemalloc snapshot): the verdicts, the sinks' reports.
            self._costs.add("verdicts", time.perf_counter() - t0 - (self._inside() - before),
                            time.thread_time() - c0 - (self._inside(self._costs.cpu)
                                                       - before_cpu))

    def _inside(self, by_part: dict[str, float] | None = None) -> float:
        s = self._costs.seconds if by_part is None else by_part
        return s.get("census", 0.0) + s.get("attribution", 0.0) + s.get("tracemalloc", 0.0)

    def check(self, summary: EpochSummary | None, at: str, epoch: int,
              partial: EpochSummary | None = None, exchange: bool = True,
              device_snapshot: Callable[[], Any] | None = None) -> CheckReport:
        """One check of ``summary`` (``at``: ``"epoch_end"``, ``"interval"`` or ``"final"``, the
        last word when the session closes): its verdicts
        and, when ``exchange``, rank 0's across ranks; the report the session hands on.
        ``device_snapshot``: the device allocator's snapshot, when its history is recorded."""
        tl = self._sampling.timeline
        closing = self._sampling.read_now()  # before any of the check's own work
        early = at == "interval" and self._config.check_every_n_steps == "auto" and \
            self._sampling.step_count < CHECK_CAP_STEPS
        defer = at != "epoch_end" and self._plan.defer_leaks(bool(tl is not None and tl.epochs),
                                                             early)
        # A check sized to the run that falls between two evaluations of a loop that evaluates
        # leaves leak verdicts to the next boundary's check: its census spans no evaluation, so
        # the memory evaluations keep (which RSS shows late, over the training steps after
        # them) reads as growth that nothing explains, and would be a belief of its own.
        defer = defer or (early and self.evaluates and self.after is None)
        origin = self.origin(summary, epoch)
        new = self.judge(summary, at, origin, partial=partial, defer_leaks=defer,
                         device_snapshot=device_snapshot, exchange=exchange, closing=closing)
        return CheckReport(
            stage=self._config.stage,
            epoch=summary.epoch if summary is not None else int(origin.epoch or 0),
            step=self._sampling.step_count, check=self.checks - 1, at=at, findings=tuple(new),
            summary=summary, rank_summaries=tuple(self.rank_summaries))

    # ------------------------------------------------------------------ a check's verdicts
    def origin(self, summary: EpochSummary | None, epoch: int) -> Origin:
        """Where this check's findings are born."""
        world = self.rank.get("world_size", 1)
        return Origin(epoch=summary.epoch if summary is not None else max(epoch - 1, 0),
                      step=summary.end_step if summary is not None else
                      self._sampling.step_count,
                      rank=self.rank.get("rank", 0) if world > 1 else None,
                      stage=self._config.stage, check=self.checks)

    def judge(self, summary: EpochSummary | None, at: str, origin: Origin, *,
              partial: EpochSummary | None = None, defer_leaks: bool = False,
              device_snapshot: Any = None, exchange: bool = True,
              closing: dict[str, float] | None = None) -> list[Finding]:
        """One check: the verdicts on ``summary`` (and, when ``exchange``, rank 0's verdicts
        across ranks); the new findings, also kept in :attr:`findings`. ``closing``: the fast
        metrics read at the check, before its own work."""
        number = self.checks  # (origin.check: the same)
        self.checks += 1
        if summary is not None and self.pace_from is None:
            self.pace_from = (summary.t_start, summary.start_step)
        pace = self.pace()
        self.marks.append((time.monotonic(), self._sampling.step_count))
        after, self.after = self.after, None
        trace = None
        own_before, churn_before, used_before = self.own_rss, self.own_churn, self.own_in_use
        if summary is not None and self.tracer is not None:
            try:  # before the analyzer, which reads the diff (keyed by the check)
                with self._costs.timed("tracemalloc"):
                    trace = self.tracer.epoch_end(number, self._sampling.step_count,
                                                  self._sampling.latest().get("host.rss"))
            except Exception as e:  # noqa: BLE001
                self.stop_tracer(e)
        new: list[Finding] = []
        analyzer = self.analyzer
        if summary is not None and analyzer is not None and "analyzer" not in self._faults:
            tracer = self.tracer
            ctx = self.context(origin, at, partial=partial, trace=trace, defer_leaks=defer_leaks,
                               device_snapshot=device_snapshot,
                               tracing=tracer is not None and tracer.active,
                               collected=tracer is not None and tracer.active
                               and tracer.collected_epoch == number,
                               own_growth=own_before, own_churn=churn_before,
                               own_in_use=used_before, closing=closing, after=after,
                               pace=pace)
            new = self._analyze(analyzer, summary, ctx, number)
        if exchange:  # every rank, even after an empty epoch; ranks meet at the same step only
            new += self._exchange_ranks(new, summary, origin)
        self.keep(new)
        return new

    def context(self, origin: Origin, at: str, *, partial: EpochSummary | None = None,
                trace: Any = None, census: str | None = None, defer_leaks: bool = False,
                device_snapshot: Any = None, tracing: bool = False,
                collected: bool = False, steps_done: int | None = None,
                own_growth: float = 0.0, own_churn: float = 0.0,
                own_in_use: float = 0.0, closing: dict[str, float] | None = None,
                after: str | None = None, pace: float | None = None) -> CheckContext:
        """What the analyzer is told at this check (it never reads the session)."""
        binding = self._sampling.binding()
        return CheckContext(
            origin=origin, at=at, partial=partial,
            limits={m: b for m, (b, _) in binding.items()},
            limit_names={m: name for m, (_, name) in binding.items()},
            total_steps=self._plan.total_steps,
            steps_done=self._sampling.step_count if steps_done is None else steps_done,
            horizon_s=self._config.horizon_s, defer_leaks=defer_leaks,
            device_kind=getattr(self._sampling.device, "kind", "cuda") or "cuda",
            census=census or self._config.census, trace=trace, tracing=tracing,
            collected=collected, device_snapshot=device_snapshot, budget=self._costs.allows,
            own_growth=own_growth, own_churn=own_churn, own_in_use=own_in_use,
            closing=closing or {}, after=after, beside_training=self.beside_training,
            seconds_per_step=pace)

    def pace(self) -> float | None:
        """The run's wall seconds per optimizer step over its last periods: since the check
        :data:`PACE_CHECKS` checks ago (since the first unit began, before that), evaluations,
        checks and everything else the run does between steps included (what a forecast in
        wall time counts with; a start-up's one-off costs leave it). None before two steps."""
        if self.pace_from is None:
            return None
        t0, s0 = self.marks[0] if len(self.marks) == PACE_CHECKS else self.pace_from
        steps = self._sampling.step_count - s0
        return (time.monotonic() - t0) / steps if steps > 1 else None

    def keep(self, new: list[Finding], before: bool = False) -> None:
        """Add findings to :attr:`findings` (``before``: restored ones, older than these),
        bounded whatever the run length: the oldest go first (every one was also returned by
        its check and handed to the sinks when it was new)."""
        self.findings = [*new, *self.findings] if before else [*self.findings, *new]
        if len(self.findings) > MAX_FINDINGS:
            del self.findings[: len(self.findings) - MAX_FINDINGS]

    def _analyze(self, analyzer: Judge, summary: EpochSummary, ctx: CheckContext,
                 number: int) -> list[Finding]:
        tracer = self.tracer
        rss0 = tracer.rss() if tracer is not None else None
        try:
            return list(analyzer.check(summary, ctx))
        except Exception as e:  # noqa: BLE001
            self._faults.disable("analyzer", e)
            return []
        finally:
            if rss0 is not None and tracer is not None:
                # Under tracing, memwatch's own work here (the census) grows the traces and the
                # RSS: the next allocation-site diff must not take that for the user's growth.
                rss1 = tracer.rss()
                if rss1 is not None:
                    tracer.note_own_rss(number, rss1 - rss0)

    def _exchange_ranks(self, new: list[Finding], summary: EpochSummary | None,
                        origin: Origin) -> list[Finding]:
        ex = self.exchange
        if ex is None or "rank exchange" in self._faults:
            return []
        try:
            from memwatch.analysis.beliefs import current, state_of
            from memwatch.analysis.rules import ACROSS_RANKS, RankInput
            from memwatch.runtime.exchange import rank_payload

            self.rank_summaries = []
            # Which leaks this rank believes in now (a leak said at an earlier check and still
            # growing counts at every exchange), and this check's other findings.
            believed = [f for f in current([*self.findings, *new])
                        if f.kind == "leak" and state_of(f) == "leak"]
            got = ex.exchange(rank_payload(self._view, [
                *believed, *(f for f in new if f.kind != "leak")], summary))
            if got is not None:  # rank 0
                self.rank_summaries = got
                last = self.rank_last_seen + [None] * (len(got) - len(self.rank_last_seen))
                self.rank_last_seen = [g if g is not None else prev
                                       for g, prev in zip(got, last[:len(got)], strict=True)]
                found = ACROSS_RANKS.judge(RankInput(got, ex.missing,
                                                     self._config.exchange_timeout_s, origin))
                beliefs = getattr(self.analyzer, "beliefs", None)
                return beliefs.across_ranks(found, origin) if beliefs is not None else found
        except Exception as e:  # noqa: BLE001
            self._faults.disable("rank exchange", e)
        return []

    def sensitivity(self) -> dict[str, float]:
        """Per leak metric, the smallest leak (bytes a step) this run's last check could count
        as growth, from that unit's measured noise and its number of steps (empty before the
        first check, or without the analyzer). See docs/findings.md."""
        fn = getattr(self.analyzer, "sensitivity", None)
        return dict(fn()) if callable(fn) else {}

    def ranks_doc(self) -> dict[str, Any] | None:
        """What a bundle says of the job's ranks (``ranks.json``): each rank's latest summary,
        the ranks that did not answer, an exchange that broke."""
        from memwatch.bundle.documents import ranks_doc

        ex = self.exchange
        return ranks_doc(self.rank_last_seen, self.job, getattr(ex, "missing", None) or [],
                         getattr(ex, "broken", None))

    def replay(self, epochs: list[EpochSummary]) -> None:
        """Feed restored epochs to the analyzer (its per-metric history and the findings it
        says once); what it finds is dropped: it was reported before the restart."""
        analyzer = self.analyzer
        if analyzer is None or "analyzer" in self._faults or not epochs:
            return
        try:
            for i, e in enumerate(epochs):
                # A census counts the objects alive now: taken once, at the last restored epoch,
                # it is the baseline the first check after the restart compares with, so it is
                # taken whatever "auto" would decide (a large heap, an epoch that looked flat):
                # without it the first verdict after a restart would wait one more epoch. The
                # allocation tracer's diffs belong to this process's checks: none here.
                last = i == len(epochs) - 1
                census = "skip" if not last else (
                    "never" if self._config.census == "never" else "always")
                ctx = self.context(Origin(epoch=e.epoch, step=e.end_step,
                                          stage=self._config.stage), "epoch_end",
                                   census=census, steps_done=e.end_step)
                analyzer.check(e, ctx)
        except Exception as exc:  # noqa: BLE001
            log.warning("memwatch: the analyzer could not replay the restored epochs (%s: %s); "
                        "verdicts start fresh", type(exc).__name__, exc)
            self.analyzer = None
            self.start_analyzer()
