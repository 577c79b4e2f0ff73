"""Checks: where a session turns its samples into verdicts.

:class:`Checks` is the part of :class:`memwatch.MemWatch` that owns the analyzer, the allocation
tracer (``tracemalloc=``) and the cross-rank exchange, and runs a check: it builds the
:class:`memwatch.analysis.CheckContext` the analyzer is told (the analyzer never reads the
session), asks for the verdicts, exchanges per-rank summaries, and hands the report to the
watchdog and the sinks. Every finding is born here complete (:class:`memwatch.core.findings.
Origin`).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from memwatch.analysis.context import CheckContext
from memwatch.core.findings import Finding, Origin
from memwatch.core.protocols import CheckReport, SessionView
from memwatch.runtime.dispatch import SinkSet
from memwatch.runtime.schedule import Schedule
from memwatch.runtime.warn import FindingWarner
from memwatch.session.checkpoint import MAX_FINDINGS
from memwatch.session.config import WatchConfig
from memwatch.timeline import EpochSummary

log = logging.getLogger("memwatch")

__all__ = ["Checks"]


class Checks:
    """The analyzer, tracer and rank exchange of :class:`memwatch.MemWatch` (a mixin)."""

    # What this part reads of the session (MemWatch defines them).
    config: WatchConfig
    view: SessionView
    analyzer: Any
    watchdog: Any
    recorder: Any
    device: Any
    findings: list[Finding]
    disabled: dict[str, str]
    rank: dict[str, int]
    job: dict[str, Any]
    epoch: int
    step_count: int
    checks: int
    total_steps: int | None
    rank_summaries: list[Any]
    rank_last_seen: list[Any]
    steps_per_epoch: int | None
    timeline: Any
    _tracer: Any
    _exchange: Any
    _sinks: SinkSet
    _slow: Any
    _schedule: Schedule
    _next_due: int
    _check_due_t: float
    _warner: FindingWarner

    def limits(self) -> dict[str, float]:
        raise NotImplementedError  # MemWatch.limits

    def latest(self) -> dict[str, float]:
        raise NotImplementedError  # MemWatch.latest

    def _disable(self, component: str, exc: BaseException) -> None:
        raise NotImplementedError  # MemWatch._disable

    def _start_exchange(self) -> None:
        """Per-rank summaries at checks (never per step) when running distributed."""
        from memwatch.runtime.exchange import RankExchange, dist_ready, job_identity, rank_info

        self.rank = rank_info()  # torch.distributed may have been initialised after __init__

        try:
            self.job = job_identity()
        except Exception:  # noqa: BLE001 - an odd environment must not stop the run
            pass
        if self.config.distributed == "off":
            return
        dist = dist_ready()
        if dist is None:
            return
        try:
            self._exchange = RankExchange(dist, float(self.config.exchange_timeout_s), self.job)
            self.job = self._exchange.job
        except Exception as e:  # noqa: BLE001
            self._disable("rank exchange", e)

    def _start_analyzer(self) -> None:
        try:
            from memwatch.analysis import Analyzer

            self.analyzer = Analyzer(self.config.analyzer_config)
        except Exception as e:  # noqa: BLE001
            self._disable("analyzer", e)

    def _start_tracer(self) -> None:
        if self.analyzer is None:
            log.info("memwatch: tracemalloc=%r does nothing without the analyzer (analyze=False "
                     "or it failed to start): only the analyzer reads it; not tracing",
                     self.config.tracemalloc_frames)
            return
        try:
            from memwatch.analysis.allocations import AllocationTracer

            self._tracer = AllocationTracer(self.config.tracemalloc_frames).start()
        except Exception as e:  # noqa: BLE001
            self._tracer = None
            self._disable("tracemalloc", e)

    def _stop_tracer(self, exc: BaseException | None = None) -> None:
        tracer, self._tracer = self._tracer, None
        if exc is not None:
            self._disable("tracemalloc", exc)
        if tracer is None:
            return
        try:
            tracer.close()
        except Exception:  # noqa: BLE001
            log.debug("memwatch: tracemalloc failed to stop", exc_info=True)

    # ------------------------------------------------------------------ checks inside epochs
    def _step_check(self, step: int) -> None:
        """The step-based check (every ``check_every_n_steps``): every rank is at this step."""
        self._interval_check(aligned=True)

    def _interval_check(self, aligned: bool) -> list[Finding]:
        """A check inside the epoch: judge the segment since the previous check (and the epoch
        so far, once an epoch ended); :meth:`_check` warns about what it finds (``step()``
        returns nothing)."""
        tl = self.timeline
        if tl is None or self.analyzer is None or "analyzer" in self.disabled:
            return []
        try:
            summary = tl.end_segment()
            partial = tl.epoch_so_far() if tl.epochs else None
        except Exception as e:  # noqa: BLE001
            self._disable("segment summary", e)
            return []
        if summary is None:
            return []
        return self._check(summary, "interval", partial=partial, exchange=aligned)

    def _checked(self) -> None:
        """After any check: the next one is due ``check_every_n_steps`` / ``check_every_s`` from
        now."""
        every_s = self.config.check_every_s
        self._check_due_t = time.monotonic() + every_s if every_s is not None else math.inf
        self._schedule.restart("check", self.step_count)
        self._next_due = self._schedule.next_due

    def _defer_leaks(self) -> bool:
        """In the first epoch of a run planned to have more, only its end tells a leak from
        epoch-scoped accumulation: checks inside it leave those verdicts to the epoch end."""
        spe = self.steps_per_epoch
        if not spe or (self.timeline is not None and self.timeline.epochs):
            return False
        return self.total_steps is None or self.total_steps > 1.5 * spe

    # ------------------------------------------------------------------ every check
    def _origin(self, summary: EpochSummary | None) -> Origin:
        world = self.rank.get("world_size", 1)
        return Origin(epoch=summary.epoch if summary is not None else max(self.epoch - 1, 0),
                      step=summary.end_step if summary is not None else self.step_count,
                      rank=self.rank.get("rank", 0) if world > 1 else None,
                      stage=self.config.stage, check=self.checks)

    def _context(self, origin: Origin, at: str, partial: EpochSummary | None = None,
                 trace: Any = None, census: str | None = None) -> CheckContext:
        """What the analyzer is told at this check (it never reads the session)."""
        tracer = self._tracer
        return CheckContext(
            origin=origin, at=at, partial=partial, limits=self.limits(),
            total_steps=self.total_steps, steps_done=self.step_count,
            horizon_s=self.config.horizon_s,
            defer_leaks=at == "interval" and self._defer_leaks(),
            device_kind=getattr(self.device, "kind", "cuda") or "cuda",
            census=census or self.config.census, trace=trace,
            tracing=tracer is not None and tracer.active,
            collected=tracer is not None and tracer.active
            and tracer.collected_epoch == origin.check,
            device_snapshot=self._device_snapshot())

    def _device_snapshot(self) -> Any:
        """The device's allocator snapshot reader, when its history is being recorded."""
        rec, dev = self.recorder, self.device
        if rec is None or dev is None or not getattr(rec, "history_recording", False):
            return None
        return getattr(dev, "snapshot", None)

    def _check(self, summary: EpochSummary | None, at: str, partial: EpochSummary | None = None,
               exchange: bool = True) -> list[Finding]:
        origin = self._origin(summary)
        self.checks += 1
        trace = None
        if summary is not None and self._tracer is not None:
            try:  # before the analyzer, which reads the diff (keyed by the check)
                trace = self._tracer.epoch_end(origin.check, self.step_count,
                                               self.latest().get("host.rss"))
            except Exception as e:  # noqa: BLE001
                self._stop_tracer(e)
        new: list[Finding] = []
        if summary is not None and self.analyzer is not None and "analyzer" not in self.disabled:
            new = self._judge(summary, self._context(origin, at, partial, trace))
        if exchange:  # every rank, even after an empty epoch; ranks meet at the same step only
            new += self._exchange_ranks(new, summary, origin)
        self.findings.extend(new)
        if len(self.findings) > MAX_FINDINGS:
            # Bounded whatever the run length: the oldest findings go first (every one was also
            # returned by its check and handed to the sinks when it was new).
            del self.findings[: len(self.findings) - MAX_FINDINGS]
        if self.watchdog is not None and new and "watchdog" not in self.disabled:
            try:
                self.watchdog.on_findings(new)
            except Exception as e:  # noqa: BLE001
                self._disable("watchdog", e)
        if self._sinks and summary is not None:
            self._sinks.check(CheckReport(
                stage=self.config.stage, epoch=summary.epoch, step=self.step_count,
                check=origin.check or 0, at=at, findings=tuple(new), summary=summary,
                rank_summaries=tuple(self.rank_summaries)))
        if self.config.warn and new:
            # Once each: inside an epoch (step() returns nothing) a threat is a MemWatchWarning;
            # every new leak verdict, whatever its severity, at least a one-line notice.
            self._warner.tell(new, warn=at == "interval")
        self._refresh_slow()
        self._checked()
        return new

    def _refresh_slow(self) -> None:
        """After a check, fresh slow readings (USS/PSS, RSS by kind, workers) for the rows of the
        next unit. The closed unit's rows are already summarised, so a read before the check
        reaches no verdict; read after it, the next unit starts from what the check left (its
        census, its findings), as the per-step RSS does, instead of showing it one unit late
        when the unit is shorter than the background interval."""
        if self._slow is None:
            return
        try:
            self._slow.poll()
        except Exception as e:  # noqa: BLE001 - each probe guards itself; this is the backstop
            self._disable("slow reader", e)

    def _judge(self, summary: EpochSummary, ctx: CheckContext) -> list[Finding]:
        tracer = self._tracer
        rss0 = tracer.rss() if tracer is not None else None
        try:
            return list(self.analyzer.check(summary, ctx))
        except Exception as e:  # noqa: BLE001
            self._disable("analyzer", e)
            return []
        finally:
            if rss0 is not None and tracer is not None:
                # Under tracing, memwatch's own work here (the census) grows the traces and the
                # RSS: the next allocation-site diff must not take that for the user's growth.
                rss1 = tracer.rss()
                if rss1 is not None:
                    tracer.note_own_rss(ctx.origin.check, rss1 - rss0)

    def _exchange_ranks(self, new: list[Finding], summary: EpochSummary | None,
                        origin: Origin) -> list[Finding]:
        ex = self._exchange
        if ex is None or "rank exchange" in self.disabled:
            return []
        try:
            from memwatch.analysis.ranks import cross_rank_findings
            from memwatch.runtime.exchange import rank_payload

            self.rank_summaries = []
            got = ex.exchange(rank_payload(self.view, new, summary))
            if got is not None:  # rank 0
                self.rank_summaries = got
                last = self.rank_last_seen + [None] * (len(got) - len(self.rank_last_seen))
                self.rank_last_seen = [g if g is not None else prev
                                       for g, prev in zip(got, last[:len(got)], strict=True)]
                return cross_rank_findings(got, ex.missing, self.config.exchange_timeout_s,
                                           origin)
        except Exception as e:  # noqa: BLE001
            self._disable("rank exchange", e)
        return []

