"""The runtime parts of a session: the flight recorder, the watchdog and the periodic work
they and the sinks need, wired to the session through its read-only view and callbacks.

:class:`RuntimeParts` is the part of :class:`memwatch.MemWatch` that creates them, schedules
them behind one integer compare per step (:class:`memwatch.runtime.schedule.Schedule`), and
offers the flight recorder's public entry points (``dump``, ``handle_exception``,
``capture_oom``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from memwatch.core.protocols import SessionView
from memwatch.runtime.blackbox import BlackBox, report_previous
from memwatch.runtime.dispatch import SinkSet
from memwatch.runtime.recorder import FlightRecorder
from memwatch.runtime.schedule import Schedule
from memwatch.runtime.watchdog import Watchdog
from memwatch.session.config import WatchConfig

log = logging.getLogger("memwatch")

__all__ = ["RuntimeParts"]


class RuntimeParts:
    """The recorder, watchdog and schedule of :class:`memwatch.MemWatch` (a mixin)."""

    # What this part reads of the session (MemWatch defines them).
    config: WatchConfig
    view: SessionView
    recorder: FlightRecorder | None
    watchdog: Watchdog | None
    blackbox: BlackBox | None
    previous_unclean: list[dict[str, Any]]
    should_stop: bool
    stop_reason: str | None
    step_count: int
    disabled: dict[str, str]
    rank_last_seen: list[Any]
    job: dict[str, Any]
    _exchange: Any
    _sampler: Any
    _sinks: SinkSet
    _schedule: Schedule
    _next_due: int
    _running: bool

    analyzer: Any
    _check_due_t: float

    def latest(self) -> dict[str, float]:
        raise NotImplementedError  # MemWatch.latest

    def _step_check(self, step: int) -> None:
        raise NotImplementedError  # Checks._step_check

    def _disable(self, component: str, exc: BaseException) -> None:
        raise NotImplementedError  # MemWatch._disable

    def _start_recorder_and_watchdog(self) -> None:
        rcfg = self.config.recorder_config
        if rcfg.enabled:
            from memwatch.report.html import render_bundle_html

            try:
                self.recorder = FlightRecorder(rcfg, self.view, on_bundle=self._sinks.bundle,
                                               render_report=render_bundle_html,
                                               ranks=self._ranks_doc)
                self.recorder.start()
            except Exception as e:  # noqa: BLE001
                self.recorder = None
                self._disable("flight recorder", e)
        if self.config.blackbox_every_s is not None and self.config.stage == "train":
            try:
                self.previous_unclean = report_previous(str(self.config.out_dir))
                self.blackbox = BlackBox(self.view, str(self.config.out_dir),
                                         every_s=self.config.blackbox_every_s)
                self.blackbox.start()
                if self._sampler is not None:  # its thread rewrites the record
                    self._sampler.after_poll = self.blackbox.tick
            except Exception as e:  # noqa: BLE001
                self.blackbox = None
                self._disable("black box", e)
        wcfg = self.config.watchdog_config
        if wcfg is not None:
            self.watchdog = Watchdog(wcfg, self.view, dump=self._watchdog_dump,
                                     stop=self.request_stop)
        self._plan()

    def _plan(self) -> None:
        """(Re)schedule the periodic work from the current step count."""
        s, n = self._schedule, self.step_count
        s.clear()
        if self.recorder is not None or self.watchdog is not None:
            wcfg = self.config.watchdog_config
            s.add("watch", wcfg.every_n_steps if wcfg is not None else 50, self._watch, n)
        if self._sinks and self.config.stage == "train":
            # Multiples of N, so the logged steps stay aligned across a resume.
            s.add("sinks", self.config.log_every_n_steps, self._sink_sample, n, aligned=True)
        if self.analyzer is not None:
            every_n, every_s = self.config.check_every_n_steps, self.config.check_every_s
            if every_n is not None:
                s.add("check", every_n, self._step_check, n)
            self._check_due_t = time.monotonic() + every_s if every_s is not None else math.inf
        self._next_due = s.next_due

    def add_sink(self, sink: Any) -> None:
        """Add a :class:`memwatch.sinks.Sink` (integrations call this once they found a logger)."""
        self._sinks.add(sink)
        if self._running:
            self._plan()

    def request_stop(self, reason: str) -> None:
        """Ask the run to stop gracefully (the watchdog's ``"stop"`` action): sets
        :attr:`should_stop` and :attr:`stop_reason` (the first reason is kept)."""
        if not self.should_stop:
            self.stop_reason = reason
        self.should_stop = True

    def _watchdog_dump(self, reason: str) -> Path | None:
        return self.recorder.dump(reason, trigger="watchdog") if self.recorder else None

    def _ranks_doc(self) -> dict[str, Any] | None:
        from memwatch.bundle.documents import ranks_doc

        ex = self._exchange
        return ranks_doc(self.rank_last_seen, self.job, getattr(ex, "missing", None) or [],
                         getattr(ex, "broken", None))

    def _sink_sample(self, step: int) -> None:
        self._sinks.metrics(step, self.latest())

    def _watch(self, step: int) -> None:
        """Every N steps, on the training thread: unclaimed OOM captures, the watchdog."""
        try:
            if self.recorder is not None:
                self.recorder.on_step_boundary()
            if self.watchdog is not None and "watchdog" not in self.disabled:
                self.watchdog.check()
        except Exception as e:  # noqa: BLE001
            self._disable("watchdog", e)
            self.watchdog = None

    # ------------------------------------------------------------------ flight recorder
    def dump(self, reason: str, exc: BaseException | None = None) -> Path | None:
        """Write a bundle now (``trigger="manual"``); returns its path, or None (never raises)."""
        if self.recorder is None:
            return None
        return self.recorder.dump(reason, exc)

    def handle_exception(self, exc: BaseException) -> Path | None:
        """The one entry point for a failure: classify ``exc``, write a bundle if configured for
        its class (reusing the pre-unwind OOM capture), tag ``exc`` with a note and a
        ``memwatch_bundle`` attribute. Never replaces or swallows ``exc``; one bundle per exception.
        """
        if self.recorder is None:
            return None
        return self.recorder.handle_exception(exc)

    @contextmanager
    def capture_oom(self) -> Iterator[None]:
        """An OOM raised inside gets a bundle (whatever ``bundle_on`` says); every exception is
        re-raised unchanged."""
        rec = self.recorder
        if rec is not None:
            rec.forced += 1  # the OOM observer captures even when bundle_on excludes OOMs
        try:
            yield
        except BaseException as e:
            if rec is not None:
                rec.handle_exception(e, force_oom=True)
            raise
        finally:
            if rec is not None:
                rec.forced -= 1

