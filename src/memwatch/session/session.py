"""``MemWatch``: the one object that integrations and users drive.

Lifecycle: construct (validates the options into a :class:`memwatch.WatchConfig`, raises
:class:`memwatch.ConfigError`) → ``start()`` (opens probes, starts the background sampler) →
``step()`` once per optimizer step → ``end_epoch()`` at every epoch end (a *check*: verdicts) →
``close()`` (idempotent).

A session is a composition of small parts, each the only writer of its own state:
:class:`~memwatch.session.sampling.Sampling` (probes, timeline, step count),
:class:`~memwatch.session.scheduler.Scheduler` (what is due, by steps and by time),
:class:`~memwatch.session.checker.Checker` (analyzer, tracer, rank exchange, findings),
:class:`~memwatch.session.runtime.Runtime` (flight recorder, black box, watchdog, stop request),
:class:`~memwatch.session.checkpoint.Checkpointer` (state across a restart),
:class:`~memwatch.session.faults.Faults` (what was turned off) and
:class:`~memwatch.session.thread.TrainingThread` (which thread steps it). This class wires them
and hands each check's report on (the watchdog, the sinks, the console, the schedule); the
runtime parts get a read-only view of it and explicit callbacks, never the session.

After ``start()`` nothing in here raises into the training loop: a failing part is turned off
with one warning naming the cause (:class:`~memwatch.session.faults.Faults`).

Threading: ``step()``, ``end_epoch()`` and ``close()`` belong to the thread that trains (one
session, one training thread: the first ``step()`` binds it); a ``step()`` from another thread
is ignored with one warning.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from memwatch.bundle.paths import OutputPaths
from memwatch.core.costs import Costs
from memwatch.core.errors import ConfigError
from memwatch.core.exiting import at_exit
from memwatch.core.findings import Finding
from memwatch.core.forking import ForkRegistry
from memwatch.core.protocols import SessionView
from memwatch.core.safefs import check_out_dir
from memwatch.probes.base import DeviceProbe, Probe
from memwatch.runtime.blackbox import BlackBox
from memwatch.runtime.dispatch import SinkSet
from memwatch.runtime.recorder import FlightRecorder
from memwatch.runtime.warn import FindingWarner
from memwatch.runtime.watchdog import Watchdog
from memwatch.session.answer import Answer
from memwatch.session.cadence import check_steps
from memwatch.session.checker import MAX_FINDINGS, Checker
from memwatch.session.checkpoint import Checkpointer
from memwatch.session.config import CHECK_CAP_STEPS, WatchConfig
from memwatch.session.faults import Faults
from memwatch.session.options import check_names
from memwatch.session.part import Part
from memwatch.session.plan import RunPlan
from memwatch.session.runtime import Runtime
from memwatch.session.sampling import Sampling
from memwatch.session.scheduler import Scheduler
from memwatch.session.thread import TrainingThread
from memwatch.session.view import SessionReader
from memwatch.timeline import EpochSummary, Timeline

if TYPE_CHECKING:
    from typing import Unpack

    from memwatch.analysis.analyzer import Judge
    from memwatch.session.options import WatchOptions

__all__ = ["BOUNDARY_MIN_STEPS", "MAX_FINDINGS", "MemWatch"]

#: Steps since the last check a boundary's own check needs: ``check_every_n_steps``' minimum.
BOUNDARY_MIN_STEPS = 16


class MemWatch:
    """Watches memory during training and turns samples into verdicts.

    ``MemWatch(**options)``: every option, its default and what it does are documented on
    :class:`memwatch.WatchConfig` (the validated value the options become, ``mw.config``). The
    most used: ``device`` (``None`` picks CUDA or MPS when available), ``out_dir``,
    ``total_steps``, ``census``, ``watchdog``, ``sinks``, ``tracemalloc``. A misspelled option
    raises :class:`memwatch.ConfigError` naming the closest valid one.

    Attributes (each read from the part that writes it): :attr:`config`, :attr:`findings`,
    :attr:`step_count`, :attr:`epoch`, :attr:`checks`, :attr:`timeline`, :attr:`device`,
    :attr:`recorder`, :attr:`watchdog`, :attr:`analyzer`, :attr:`sinks`, :attr:`should_stop`,
    :attr:`stop_reason`, :attr:`disabled`... (every option is on :attr:`config`).

    Example::

        >>> import memwatch
        >>> from memwatch.testing import FakeDevice
        >>> dev = FakeDevice(total_bytes=2**30)
        >>> with memwatch.watch(device=dev, workers=False, out_dir=str(tmp)) as mw:
        ...     for step in range(10):
        ...         dev.set(allocated=(step + 1) * 2**20)
        ...         mw.step()
        ...     findings = mw.end_epoch()
        >>> mw.latest()["device.allocated"]
        10485760.0
    """

    def __init__(self, **options: Unpack[WatchOptions]) -> None:
        check_names(options, "MemWatch")
        self._init(WatchConfig(**options))

    @classmethod
    def from_config(cls, config: WatchConfig) -> MemWatch:
        """A session with this configuration (``MemWatch(**options)`` builds one too)."""
        mw = cls.__new__(cls)
        mw._init(config)
        return mw

    def _init(self, config: WatchConfig) -> None:
        #: The validated options (a frozen :class:`memwatch.WatchConfig`).
        self.config = config
        self._faults = Faults()
        self._run_plan = RunPlan(config.total_steps, config.steps_per_epoch)
        self._epoch = 0
        shared = isinstance(config.sinks, SinkSet)
        self._sinks = config.sinks if isinstance(config.sinks, SinkSet) else SinkSet(config.sinks)
        self._owns_sinks = not shared
        #: The read-only view the runtime parts get (:class:`memwatch.core.protocols.SessionView`).
        self.view: SessionView = cast(SessionView, SessionReader(self))
        self._costs = Costs()
        self._sampling = Sampling(config, self._faults, self._costs)
        self._scheduler = Scheduler()
        self._runtime = Runtime(config, self.view, self._sinks, self._faults)
        self._checker = Checker(config, self.view, self._faults, self._sampling, self._run_plan,
                                self._costs)
        self._checkpoints = Checkpointer()
        self._answer = Answer(config)
        self._warner = FindingWarner()
        self._training_thread = TrainingThread(self._costs)
        self._running = False
        self._closed = False
        self._pid = os.getpid()

    # ------------------------------------------------------------------ what it reads as
    # Each attribute has one writer: the part that owns it. The session reads it through.
    #: Optimizer steps recorded (continuing across a resume).
    step_count: Part[int] = Part("_sampling", "step_count")
    #: The fixed-memory store of samples (None before ``start()``).
    timeline: Part[Timeline | None] = Part("_sampling", "timeline")
    #: The device probe (None: host and workers only).
    device: Part[DeviceProbe | None] = Part("_sampling", "device")
    probes: Part[list[Probe]] = Part("_sampling", "probes")
    #: Components turned off after an error: name -> cause.
    disabled: Part[dict[str, str]] = Part("_faults", "disabled")
    #: Every finding so far (the latest 1,000); the current ones: :meth:`current_findings`.
    findings: Part[list[Finding]] = Part("_checker", "findings")
    #: Checks run so far (epoch ends and checks inside epochs).
    checks: Part[int] = Part("_checker", "checks")
    #: This process's ``rank`` and ``world_size``.
    rank: Part[dict[str, int]] = Part("_checker", "rank")
    #: Which job this process belongs to (``id``, ``source``, ``attempt``): from the launcher's
    #: environment, agreed across ranks at start when running distributed.
    job: Part[dict[str, Any]] = Part("_checker", "job")
    #: On rank 0 after a check with an exchange: one summary per rank.
    rank_summaries: Part[list[dict[str, Any] | None]] = Part("_checker", "rank_summaries")
    rank_last_seen: Part[list[dict[str, Any] | None]] = Part("_checker", "rank_last_seen")
    recorder: Part[FlightRecorder | None] = Part("_runtime", "recorder")
    #: What the closed session left in ``out_dir``: ``report.html`` and ``summary.json``.
    report_path: Part[Path | None] = Part("_answer", "report_path")
    summary_path: Part[Path | None] = Part("_answer", "summary_path")
    #: The black box (None when off, or in an evaluation session).
    blackbox: Part[BlackBox | None] = Part("_runtime", "blackbox")
    #: Runs in the same ``out_dir`` that ended without a clean close, reported at start.
    previous_unclean: Part[list[dict[str, Any]]] = Part("_runtime", "previous_unclean")
    watchdog: Part[Watchdog | None] = Part("_runtime", "watchdog")
    #: Set by the watchdog's "stop" action (with :attr:`stop_reason`); integrations map it to
    #: their framework's stop flag, a plain loop checks it.
    should_stop: Part[bool] = Part("_runtime", "should_stop")
    stop_reason: Part[str | None] = Part("_runtime", "stop_reason")
    #: Started and not closed (``step()`` samples).
    running: Part[bool] = Part("", "_running")
    #: Closed (for good: a closed session cannot start again).
    closed: Part[bool] = Part("", "_closed")
    #: Where samples, findings and bundles go (one fan-out, one failure rule).
    sinks: Part[SinkSet] = Part("", "_sinks")
    #: Epochs ended (continuing across a resume).
    epoch: Part[int] = Part("", "_epoch")
    #: The run's planned number of optimizer steps (the forecast horizon), when known.
    total_steps: Part[int | None] = Part("_run_plan", "total_steps")
    #: The epoch length, when known (the adapters set it from the framework).
    steps_per_epoch: Part[int | None] = Part("_run_plan", "steps_per_epoch")
    # The options most read back under their own names (every one is on ``config``).
    out_dir: Part[str] = Part("config", "out_dir")
    stage: Part[str] = Part("config", "stage")
    census_mode: Part[str] = Part("config", "census")
    host: Part[bool] = Part("config", "host")
    workers: Part[bool] = Part("config", "workers")
    interval_s: Part[float | None] = Part("config", "interval_s")
    log_every_n_steps: Part[int] = Part("config", "log_every_n_steps")
    tracemalloc_frames: Part[int] = Part("config", "tracemalloc_frames")
    # What it answers, each the owning part's method (its documentation is there).
    #: ``latest()``: the last sample as a flat dict of metric -> value (bytes, counts).
    latest: Part[Callable[[], dict[str, float]]] = Part("_sampling", "latest")
    #: ``limits()``: the byte limit per metric that binds first.
    limits: Part[Callable[[], dict[str, float]]] = Part("_sampling", "limits")
    #: The epoch summaries kept.
    epochs: Part[list[EpochSummary]] = Part("_sampling", "epochs")
    worker_details: Part[Callable[[], list[dict[str, float]]]] = Part("_sampling",
                                                                       "worker_details")
    worker_reading: Part[Callable[[int], dict[str, float] | None]] = Part("_sampling",
                                                                           "worker_reading")
    cgroup_info: Part[Callable[[], dict[str, Any] | None]] = Part("_sampling", "cgroup_info")
    #: ``sensitivity()``: per leak metric, the smallest leak the last check could count.
    sensitivity: Part[Callable[[], dict[str, float]]] = Part("_checker", "sensitivity")
    #: ``costs()``: seconds memwatch's own work off the hot path took, by part.
    costs: Part[Callable[[], dict[str, float]]] = Part("_costs", "snapshot")
    # The flight recorder's entry points and the graceful stop (the runtime's).
    dump: Part[Callable[..., Path | None]] = Part("_runtime", "dump")
    handle_exception: Part[Callable[[BaseException], Path | None]] = Part(
        "_runtime", "handle_exception")
    capture_oom: Part[Callable[[], AbstractContextManager[None]]] = Part("_runtime",
                                                                          "capture_oom")
    request_stop: Part[Callable[[str], None]] = Part("_runtime", "request_stop")

    @property
    def analyzer(self) -> Judge | None:
        """The analyzer (None when ``analyze=False`` or it failed to start). Any object with
        ``check(summary, context) -> list[Finding]`` may replace it."""
        return self._checker.analyzer

    @analyzer.setter
    def analyzer(self, analyzer: Judge | None) -> None:
        self._checker.use_analyzer(analyzer)

    def plan_run(self, total_steps: int | None = None, steps_per_epoch: int | None = None,
                 epochs: bool | None = None) -> None:
        """The run's planned length and its epochs' length, when the framework knows them
        (each ignored when None or already given as an option); ``epochs=False``: the loop has
        none (its first checks may judge leaks: :class:`memwatch.session.plan.RunPlan`)."""
        self._run_plan.plan(total_steps, steps_per_epoch, epochs)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> MemWatch:
        """Open the probes and start the background sampler. Returns ``self``."""
        if self._running:
            return self
        if self._closed:
            raise ConfigError("this MemWatch was closed; create a new one to watch again.")
        t0 = time.perf_counter()
        self._costs.start = time.monotonic()
        cfg = self.config
        paths = OutputPaths.resolve(cfg.out_dir)  # once: a later chdir moves nothing
        if cfg.recorder or (cfg.stage == "train" and (cfg.blackbox_every_s is not None
                                                      or cfg.run_report != "none")):
            check_out_dir(paths.given, cfg.share)  # ConfigError when unsafe (docs/security.md)
        self._sampling.open()
        self._checker.start()
        pending = self._checkpoints.take_pending()
        if pending is not None:
            # Before the recorder, watchdog and sinks schedule their ticks from step_count.
            self._restore(pending)
        self._runtime.start(paths, self._checker.ranks_doc, self._sampling.after_each_poll)
        self._answer.start(paths)
        self._plan()
        self._running = True
        _in_children.add(self)
        at_exit.add(self)  # a run that never closes is closed cleanly when the interpreter exits
        self._costs.add("start", time.perf_counter() - t0)
        return self

    def close(self) -> None:
        """The last word (a check of what was seen since the last one), then stop the sampler,
        release probes, and leave the run's report and ``summary.json`` in ``out_dir``
        (``run_report=``). Idempotent; never raises."""
        if self._closed:
            return
        if self._running and os.getpid() == self._pid:
            self._interval_check(False, self.step_count, at="final")
        self._closed = True
        self._running = False
        if os.getpid() != self._pid:
            return  # a forked child owns none of this
        at_exit.discard(self)
        self._scheduler.clear()
        self._runtime.final_bundle()
        if self._sinks and self._owns_sinks:
            self._sinks.close()
        self._runtime.close()
        self._sampling.close()
        self._warner.flush()
        self._checker.close()
        self._answer.leave(self, self._costs)

    def __enter__(self) -> MemWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _plan(self) -> None:
        """(Re)schedule the periodic work from the current step count."""
        s, n, cfg = self._scheduler, self.step_count, self.config
        s.clear()
        if self._runtime.watches:
            wcfg = cfg.watchdog_config
            s.every_steps("watch", wcfg.every_n_steps if wcfg is not None else 50,
                          self._runtime.watch, n)
        if self._sinks and cfg.stage == "train":
            # Multiples of N, so the logged steps stay aligned across a resume.
            s.every_steps("sinks", cfg.log_every_n_steps, self._sink_sample, n, aligned=True)
        if self._checker.analyzer is not None:
            s.checks(check_steps(cfg.check_every_n_steps, CHECK_CAP_STEPS,
                                 self._checker.exchange is not None, self._epoch > 0),
                     cfg.check_every_s,
                     functools.partial(self._interval_check, True),
                     functools.partial(self._interval_check, False), n, self._sampling.clock())

    # ------------------------------------------------------------------ hot path
    def step(self) -> None:
        """Record one sample. Call once per optimizer step, at the same point of every step,
        from the thread that trains."""
        if not self._running:
            return
        thread = self._training_thread
        if threading.get_ident() != thread.ident and thread.other():
            return
        try:
            t = self._sampling.record()
        except Exception:  # noqa: BLE001
            t = self._recover_step()
        s = self._scheduler
        if self._sampling.step_count >= s.next_due or t >= s.due_t:
            self._run_due(t)

    def _run_due(self, t: float) -> None:
        try:
            self._scheduler.run(self.step_count, t)
        except Exception as e:  # noqa: BLE001 - each task guards itself; this is the backstop
            self._faults.disable("schedule", e)

    def _recover_step(self) -> float:
        """Slow path after a failure: find the failing probe, disable it, keep sampling."""
        try:
            return self._sampling.recover()
        except Exception as e:  # noqa: BLE001
            self._faults.disable("sampler", e)
            self._running = False
            return self._sampling.clock()

    def hand_over(self) -> None:
        """The calling thread steps this session from now on. For a driver that sampled the
        session from a timer thread until training began (``memwatch run``'s time mode): call
        it from the training thread, once the timer has stopped stepping."""
        self._training_thread.hand_over()

    # ------------------------------------------------------------------ checks
    def end_epoch(self) -> list[Finding]:
        """Close the epoch and judge it (a check): returns the new findings (never raises)."""
        tl = self.timeline
        if not self._running or tl is None:
            return []
        try:
            summary = tl.end_epoch()
        except Exception as e:  # noqa: BLE001
            self._faults.disable("epoch summary", e)
            return []
        self._epoch += 1
        return self._check(summary, "epoch_end")

    def boundary(self, after: str = "val", check: bool = True) -> list[Finding]:
        """``after`` (an evaluation loop, "val") ran since the last step: the next check reads
        memory after it, so what it kept shows as a stair (two equal stairs in a row, held, are
        a leak: ``docs/findings.md``). ``check``: that check runs now when at least
        :data:`BOUNDARY_MIN_STEPS` steps passed since the last. Never raises."""
        if not self._running:
            return []
        self._checker.passed(after)
        tl = self.timeline
        got = self._checker.interval_summary() if check and tl is not None and \
            tl.segment_samples >= BOUNDARY_MIN_STEPS else None
        return [] if got is None else self._check(got[0], "interval", partial=got[1],
                                                  exchange=False)

    def judge_beside_training(self) -> None:
        """An evaluation loop beside a training session of this process (the adapters call
        it): memory kept across evaluations is that session's to judge."""
        self._checker.judge_beside_training()

    def current_findings(self) -> list[Finding]:
        """The current verdicts: one finding per belief, its latest state (a leak that stopped
        is its plateau; :attr:`findings` keeps the history). See ``docs/findings.md``."""
        return self._checker.current()

    def _interval_check(self, aligned: bool, step: int, at: str = "interval") -> None:
        """A check inside the epoch (by steps, ``aligned``: ranks exchange summaries; or by
        time), or the last word at close (``at="final"``): the segment since the previous
        check (and the epoch so far once one ended); its findings are warned about."""
        got = self._checker.interval_summary()
        if got is not None:
            self._check(got[0], at, partial=got[1], exchange=aligned)

    def _check(self, summary: EpochSummary | None, at: str, partial: EpochSummary | None = None,
               exchange: bool = True) -> list[Finding]:
        """One check, its report handed on: the watchdog, the sinks, the console, the
        schedule. memwatch's own work in all of it is measured (the run is judged without
        it)."""
        with self._checker.own_work():
            report = dataclasses.replace(self._checker.check(
                summary, at, self._epoch, partial=partial, exchange=exchange,
                device_snapshot=self._runtime.device_snapshot(self.device)),
                current=tuple(self.current_findings()))
            self._runtime.on_check(report)
            if self._sinks and summary is not None:
                self._sinks.check(report)
            if self.config.warn:
                # Once each: inside an epoch (step() returns nothing) a threat is a
                # MemWatchWarning; every new leak verdict, whatever its severity, at least a
                # one-line notice.
                self._warner.tell(report.findings, warn=at == "interval", at=at)
                self._warner.end_check(at, self.config.stage)
            self._sampling.refresh_slow()
            self._scheduler.checked(self.step_count, self._sampling.clock(),
                                    epoch_end=at == "epoch_end")
        return list(report.findings)

    def _sink_sample(self, step: int) -> None:
        with self._costs.timed("sinks"):
            self._sinks.metrics(step, self.latest())

    def add_sink(self, sink: Any) -> None:
        """Add a :class:`memwatch.sinks.Sink` (integrations call this once they found a logger)."""
        self._sinks.add(sink)
        if self._running:
            self._plan()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this session (plain data: its epoch summaries, step count,
        epoch and findings), so a resumed run's verdicts span the restart. Never raises. See
        :class:`memwatch.session.checkpoint.Checkpointer`."""
        return self._checkpoints.export(self.timeline, self.step_count, self.epoch,
                                        self.findings)

    def load_state_dict(self, state: Any) -> None:
        """Continue from a :meth:`state_dict` saved before a restart, before ``start()`` or after
        it (before the first epoch end): the epochs are replayed through the analyzer, the
        findings restored, the step numbering continued. A state that cannot be used logs a
        warning and the session starts fresh; never raises."""
        if self.timeline is None:
            self._checkpoints.hold(state)
            return
        self._restore(state)

    def _restore(self, state: Any) -> None:
        epoch = self._checkpoints.restore(state, self._sampling, self._checker)
        if epoch is None:
            return
        self._epoch = max(self._epoch, epoch)
        if self._running:  # the periodic work was scheduled from the old step count
            self._plan()

    def after_fork_in_child(self) -> None:
        """In a forked child (a DataLoader worker), which inherits a copy of this session: it
        must not sample, write bundles or join a thread that does not exist there."""
        self._running = False
        self._closed = True
        self._sampling.after_fork_in_child()
        self._runtime.after_fork_in_child()
        self._checker.after_fork_in_child()



#: Every started session: a forked child (a DataLoader worker) makes its copies inert.
_in_children = ForkRegistry("after_fork_in_child")
