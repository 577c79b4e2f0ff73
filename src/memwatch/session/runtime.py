"""The runtime parts of a session: the flight recorder, the black box and the watchdog, wired to
the session through its read-only view and explicit callbacks, and the graceful stop they may
ask for.

:class:`Runtime` creates them at start, runs their periodic work when the session's scheduler
says so, and offers the flight recorder's entry points (``dump``, ``handle_exception``,
``capture_oom``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from memwatch.bundle.paths import OutputPaths
from memwatch.core.protocols import CheckReport, SessionView
from memwatch.runtime.blackbox import BlackBox, report_previous
from memwatch.runtime.dispatch import SinkSet
from memwatch.runtime.recorder import FlightRecorder
from memwatch.runtime.watchdog import Watchdog
from memwatch.session.config import WatchConfig
from memwatch.session.faults import Faults

log = logging.getLogger("memwatch")

__all__ = ["Runtime"]


class Runtime:
    """The recorder, black box, watchdog and stop request of one session.

    Attributes:
        recorder: the flight recorder (None when off or it failed to start).
        blackbox: the record that survives SIGKILL (None when off, or in an evaluation session).
        previous_unclean: runs in the same ``out_dir`` that ended without a clean close.
        watchdog: thresholds and actions (None when off).
        should_stop, stop_reason: the watchdog's ``"stop"`` action (the first reason kept).
    """

    def __init__(self, config: WatchConfig, view: SessionView, sinks: SinkSet,
                 faults: Faults) -> None:
        self._config = config
        self._view = view
        self._sinks = sinks
        self._faults = faults
        self.recorder: FlightRecorder | None = None
        self.blackbox: BlackBox | None = None
        self.previous_unclean: list[dict[str, Any]] = []
        self.watchdog: Watchdog | None = None
        self.should_stop = False
        self.stop_reason: str | None = None

    def start(self, paths: OutputPaths, ranks_doc: Callable[[], dict[str, Any] | None],
              after_each_poll: Callable[[Callable[[], None]], None]) -> None:
        """The parts, writing under ``paths`` (the session's ``out_dir``, resolved once)."""
        cfg = self._config
        rcfg = cfg.recorder_config
        if rcfg.enabled:
            from memwatch.report.html import render_bundle_html

            try:
                self.recorder = FlightRecorder(rcfg, self._view, oom_dir=paths.oom,
                                               end_dir=paths.end_of_run,
                                               on_bundle=self._sinks.bundle,
                                               render_report=render_bundle_html, ranks=ranks_doc)
                self.recorder.start()
            except Exception as e:  # noqa: BLE001
                self.recorder = None
                self._faults.disable("flight recorder", e)
        if cfg.blackbox_every_s is not None and cfg.stage == "train":
            try:
                self.previous_unclean = report_previous(paths, share=cfg.share)
                self.blackbox = BlackBox(self._view, paths, every_s=cfg.blackbox_every_s,
                                         share=cfg.share)
                self.blackbox.start()
                after_each_poll(self.blackbox.tick)  # the sampler's thread rewrites the record
            except Exception as e:  # noqa: BLE001
                self.blackbox = None
                self._faults.disable("black box", e)
        wcfg = cfg.watchdog_config
        if wcfg is not None:
            self.watchdog = Watchdog(wcfg, self._view, dump=self._watchdog_dump,
                                     stop=self.request_stop)

    @property
    def watches(self) -> bool:
        """There is periodic work for :meth:`watch` (a recorder or a watchdog)."""
        return self.recorder is not None or self.watchdog is not None

    def watch(self, step: int) -> None:
        """Every N steps, on the training thread: unclaimed OOM captures, the watchdog."""
        try:
            if self.recorder is not None:
                self.recorder.on_step_boundary()
            if self.watchdog is not None and "watchdog" not in self._faults:
                self.watchdog.check()
        except Exception as e:  # noqa: BLE001
            self._faults.disable("watchdog", e)
            self.watchdog = None

    def on_check(self, report: CheckReport) -> None:
        """A check's new findings reach the watchdog (forecast alerts). Not the last check at
        close (``at="final"``): the run is over, there is no crash left to prevent, and its
        findings are the report's."""
        new = list(report.findings)
        if self.watchdog is not None and new and report.at != "final" \
                and "watchdog" not in self._faults:
            try:
                self.watchdog.on_findings(new)
            except Exception as e:  # noqa: BLE001
                self._faults.disable("watchdog", e)

    def request_stop(self, reason: str) -> None:
        """Ask the run to stop gracefully (the watchdog's ``"stop"`` action): sets
        :attr:`should_stop` and :attr:`stop_reason` (the first reason is kept)."""
        if not self.should_stop:
            self.stop_reason = reason
        self.should_stop = True

    def _watchdog_dump(self, reason: str) -> Path | None:
        return self.recorder.dump(reason, trigger="watchdog") if self.recorder else None

    def device_snapshot(self, device: Any) -> Callable[[], Any] | None:
        """``device``'s allocator snapshot reader, when the recorder records its history (a
        device leak's tensors are then joined to where they were allocated)."""
        if device is None or not getattr(self.recorder, "history_recording", False):
            return None
        return getattr(device, "snapshot", None)

    # ------------------------------------------------------------------ flight recorder
    def dump(self, reason: str, exc: BaseException | None = None) -> Path | None:
        """Write a bundle now (``trigger="manual"``); returns its path, or None (never
        raises)."""
        return self.recorder.dump(reason, exc) if self.recorder is not None else None

    def handle_exception(self, exc: BaseException) -> Path | None:
        """The one entry point for a failure: classify ``exc``, write a bundle if configured for
        its class (reusing the pre-unwind OOM capture), tag ``exc`` with a note and a
        ``memwatch_bundle`` attribute. Never replaces or swallows ``exc``; one bundle per
        exception."""
        return self.recorder.handle_exception(exc) if self.recorder is not None else None

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

    def final_bundle(self) -> None:
        """Before the recorder closes: an exception in flight gets its bundle first (the sinks
        should see it), and a sink may ask for an end-of-run bundle (report and snapshot)."""
        if not self._sinks or self.recorder is None:
            return
        try:
            in_flight = sys.exc_info()[1]
            if in_flight is not None:
                self.recorder.handle_exception(in_flight)
            elif self._sinks.wants_final_bundle():
                self.recorder.dump("report and snapshot for the sinks", trigger="end_of_run")
        except Exception as e:  # noqa: BLE001
            log.debug("memwatch: no end-of-run bundle (%s)", e)

    # ------------------------------------------------------------------ end
    def after_fork_in_child(self) -> None:
        if self.blackbox is not None:
            self.blackbox.forget_after_fork()

    def close(self) -> None:
        """The black box is closed (a clean end leaves no record) and the recorder stopped."""
        if self.blackbox is not None:
            self.blackbox.close()
        if self.recorder is not None:
            try:
                self.recorder.close()
            except Exception:  # noqa: BLE001
                log.debug("memwatch: flight recorder failed to close", exc_info=True)
