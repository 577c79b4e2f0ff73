"""``MemWatch``: the one object that integrations and users drive.

Lifecycle: construct (validates the options into a :class:`memwatch.WatchConfig`, raises
:class:`memwatch.ConfigError`) → ``start()`` (opens probes, starts the background sampler) →
``step()`` once per optimizer step → ``end_epoch()`` at every epoch end (a *check*: verdicts) →
``close()`` (idempotent).

After ``start()`` nothing in here raises into the training loop: a failing component logs one
warning naming the cause and disables itself. The runtime parts (flight recorder, watchdog, rank
exchange) get a read-only view of this session and explicit callbacks, never the session.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from memwatch.core.errors import ConfigError
from memwatch.core.findings import Finding
from memwatch.core.forking import ForkRegistry
from memwatch.core.protocols import SessionView
from memwatch.core.safefs import check_out_dir
from memwatch.probes.base import DeviceProbe, Probe
from memwatch.runtime.blackbox import BlackBox
from memwatch.runtime.dispatch import SinkSet
from memwatch.runtime.exchange import rank_info
from memwatch.runtime.recorder import FlightRecorder
from memwatch.runtime.schedule import Schedule
from memwatch.runtime.warn import FindingWarner
from memwatch.runtime.watchdog import Watchdog
from memwatch.session.checkpoint import MAX_FINDINGS, Checkpointing
from memwatch.session.checks import Checks
from memwatch.session.config import WatchConfig
from memwatch.session.probes import NanProbe, open_probes, resolve_device
from memwatch.session.runtime import RuntimeParts
from memwatch.session.view import SessionReader
from memwatch.timeline import EpochSummary, Timeline
from memwatch.timeline.sampler import BackgroundSampler, SlowReader

log = logging.getLogger("memwatch")

__all__ = ["MAX_FINDINGS", "MemWatch", "SessionReader", "rank_info", "watch"]

#: Attribute -> WatchConfig field: the options a MemWatch answers for (``mw.census_mode`` is
#: ``mw.config.census``; ``tracemalloc_frames`` the frame count ``tracemalloc=`` amounts to).
_OPTION_ATTRS = {
    **{name: name for name in (
        "host", "workers", "out_dir", "interval_s", "capacity", "buckets_per_epoch", "analyze",
        "distributed", "exchange_timeout_s", "log_every_n_steps", "tracemalloc_frames", "stage")},
    "census_mode": "census",
}


class MemWatch(Checks, RuntimeParts, Checkpointing):
    """Watches memory during training and turns samples into verdicts.

    ``MemWatch(**options)``: every option, its default and what it does are documented on
    :class:`memwatch.WatchConfig` (the validated value the options become, ``mw.config``).
    The most used: ``device`` (``None`` picks CUDA or MPS when available), ``out_dir``,
    ``total_steps``, ``census``, ``watchdog``, ``sinks``, ``tracemalloc``.

    Attributes (besides the options, readable under their names): :attr:`findings`,
    :attr:`step_count`, :attr:`epoch`, :attr:`checks`, :attr:`timeline`, :attr:`device`,
    :attr:`recorder`, :attr:`watchdog`, :attr:`analyzer`, :attr:`sinks`, :attr:`should_stop`
    and :attr:`stop_reason`, :attr:`disabled`.

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

    def __init__(
        self,
        device: Any = None,
        host: bool = True,
        workers: bool = True,
        out_dir: str | os.PathLike[str] = "memwatch",
        interval_s: float = 1.0,
        capacity: int = 32768,
        buckets_per_epoch: int = 256,
        total_steps: int | None = None,
        analyze: bool = True,
        census: str = "auto",
        analyzer_config: Any = None,
        distributed: str = "auto",
        exchange_timeout_s: float = 60.0,
        recorder: bool = True,
        bundle_on: Any = "oom",
        max_bundles: int = 20,
        max_bundle_bytes: int = 256 << 20,
        max_total_bytes: int = 1 << 30,
        record_history: bool = False,
        signals: bool = True,
        bundle_report: str = "auto",
        watchdog: Any = True,
        sinks: Sequence[Any] | SinkSet | None = None,
        log_every_n_steps: int = 50,
        tracemalloc: bool | int = False,
        stage: str = "train",
        check_every_n_steps: int | None = 5000,
        check_every_s: float | None = 600.0,
        horizon_s: float = 3 * 86400.0,
        steps_per_epoch: int | None = None,
        warn: bool = True,
        blackbox_every_s: float | None = 5.0,
    ) -> None:
        self._init(WatchConfig(
            device=device, host=host, workers=workers, out_dir=out_dir, interval_s=interval_s,
            capacity=capacity, buckets_per_epoch=buckets_per_epoch, total_steps=total_steps,
            analyze=analyze, census=census, analyzer_config=analyzer_config,
            distributed=distributed, exchange_timeout_s=exchange_timeout_s, recorder=recorder,
            bundle_on=bundle_on, max_bundles=max_bundles, max_bundle_bytes=max_bundle_bytes,
            max_total_bytes=max_total_bytes, record_history=record_history, signals=signals,
            bundle_report=bundle_report, watchdog=watchdog, sinks=sinks,
            log_every_n_steps=log_every_n_steps, tracemalloc=tracemalloc, stage=stage,
            check_every_n_steps=check_every_n_steps, check_every_s=check_every_s,
            horizon_s=horizon_s, steps_per_epoch=steps_per_epoch, warn=warn,
            blackbox_every_s=blackbox_every_s))

    @classmethod
    def from_config(cls, config: WatchConfig) -> MemWatch:
        """A session with this configuration (``MemWatch(**options)`` builds one too)."""
        mw = cls.__new__(cls)
        mw._init(config)
        return mw

    def _init(self, config: WatchConfig) -> None:
        #: The validated options (a frozen :class:`memwatch.WatchConfig`).
        self.config = config
        #: The run's planned number of optimizer steps (the forecast horizon); integrations set
        #: it from the framework when the user did not.
        self.total_steps: int | None = config.total_steps
        #: The epoch length, when known (the adapters set it from the framework).
        self.steps_per_epoch: int | None = config.steps_per_epoch
        shared = isinstance(config.sinks, SinkSet)
        self._sinks = config.sinks if isinstance(config.sinks, SinkSet) else SinkSet(config.sinks)
        self._owns_sinks = not shared
        #: Set by the watchdog's "stop" action (with :attr:`stop_reason`); integrations map it to
        #: their framework's stop flag, a plain loop checks it.
        self.should_stop = False
        self.stop_reason: str | None = None
        self.recorder: FlightRecorder | None = None
        #: The black box (None when off, or in an evaluation session).
        self.blackbox: BlackBox | None = None
        #: Runs in the same ``out_dir`` that ended without a clean close, reported at start.
        self.previous_unclean: list[dict[str, Any]] = []
        self.watchdog: Watchdog | None = None
        #: The analyzer (None when ``analyze=False`` or it failed to start).
        self.analyzer: Any = None
        self.device: DeviceProbe | None = None
        self.probes: list[Probe] = []
        self.timeline: Timeline | None = None
        self.findings: list[Finding] = []
        self.epoch = 0
        self.step_count = 0
        self.checks = 0
        self.rank = rank_info()
        #: Which job this process belongs to (``id``, ``source``, ``attempt``): from the launcher's
        #: environment, agreed across ranks at start when running distributed. Recorded in every
        #: bundle so ``memwatch ls`` can group the bundles of one job's ranks.
        self.job: dict[str, Any] = {"id": None, "source": None, "attempt": None}
        #: On rank 0 after each check: one summary per rank (None for a rank that did not
        #: answer); empty after a check without an exchange (none yet, or it broke), so loggers
        #: never log the same figures twice. See memwatch.runtime.exchange.
        self.rank_summaries: list[Any] = []
        #: On rank 0: each rank's latest summary ever received (None: never), for ranks.json.
        self.rank_last_seen: list[Any] = []
        #: Components turned off after an error: name -> cause.
        self.disabled: dict[str, str] = {}
        #: The read-only view the runtime parts get (:class:`memwatch.core.protocols.SessionView`).
        self.view: SessionView = cast(SessionView, SessionReader(self))
        self._fast_probes: list[Probe] = []
        self._slow: SlowReader | None = None
        self._sampler: BackgroundSampler | None = None
        self._tracer: Any = None  # analysis.allocations.AllocationTracer while tracing
        self._exchange: Any = None  # runtime.exchange.RankExchange when distributed
        self._schedule = Schedule()
        self._next_due = sys.maxsize  # step() compares one int with this ...
        self._check_due_t = math.inf  # ... and one float: the time-based check
        self._warner = FindingWarner()
        self._running = False
        self._closed = False
        self._pid = os.getpid()
        # A checkpoint's state given before start(): applied there (see load_state_dict).
        self._pending_state: dict[str, Any] | None = None
        self._oom_kills_at_start: int | None = None  # the memory cgroup's counter at start()

    # ------------------------------------------------------------------ options
    def __getattr__(self, name: str) -> Any:
        # The options, readable under their names (``mw.out_dir`` is ``mw.config.out_dir``).
        field = _OPTION_ATTRS.get(name)
        if field is None:
            raise AttributeError(f"'MemWatch' object has no attribute {name!r}")
        return getattr(self.__dict__["config"], field)

    @property
    def sinks(self) -> SinkSet:
        """Where samples, findings and bundles go (one fan-out, one failure rule)."""
        return self._sinks

    #: Started and not closed (``step()`` samples).
    running = property(operator.attrgetter("_running"))
    #: Closed (for good: a closed session cannot start again).
    closed = property(operator.attrgetter("_closed"))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> MemWatch:
        """Open the probes and start the background sampler. Returns ``self``."""
        if self._running:
            return self
        if self._closed:
            raise ConfigError("this MemWatch was closed; create a new one to watch again.")
        cfg = self.config
        if cfg.recorder or (cfg.blackbox_every_s is not None and cfg.stage == "train"):
            check_out_dir(cfg.out_dir)  # ConfigError for an unsafe out_dir (docs/security.md)
        self.device = resolve_device(cfg.device_spec)
        self.probes = open_probes(self.device, self.host, self.workers)
        self._fast_probes = [p for p in self.probes if p.fast_keys]
        self._slow = SlowReader([p for p in self.probes if p.slow_keys], self._probe_failed)
        keys = [k for p in self._fast_probes for k in p.fast_keys] + list(self._slow.keys)
        self.timeline = Timeline(keys, capacity=cfg.capacity,
                                 buckets_per_epoch=cfg.buckets_per_epoch)
        self._slow.poll()  # values exist from the first step on
        cg = self._probe("cgroup")  # the baseline every later OOM-kill count is compared with
        self._oom_kills_at_start = cg.oom_kills() if cg is not None else None
        self._sampler = BackgroundSampler(self._slow, self.interval_s)
        self._sampler.start()
        if self.analyze:
            self._start_analyzer()
        if self._pending_state is not None:
            # Before the recorder, watchdog and sinks schedule their ticks from step_count.
            state, self._pending_state = self._pending_state, None
            self._apply_state(state)
        self._start_exchange()
        self._start_recorder_and_watchdog()
        if self.tracemalloc_frames:
            self._start_tracer()
        self._running = True
        _in_children.add(self)
        return self

    def close(self) -> None:
        """Stop the sampler, release probes. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        self._running = False
        if os.getpid() != self._pid:
            return  # a forked child owns none of this
        self._schedule.clear()
        self._next_due = sys.maxsize
        self._final_bundle()
        if self.blackbox is not None:
            self.blackbox.close()  # a clean end leaves no record behind
        if self._sinks and self._owns_sinks:
            self._sinks.close()
        if self.recorder is not None:
            try:
                self.recorder.close()
            except Exception:  # noqa: BLE001
                log.debug("memwatch: flight recorder failed to close", exc_info=True)
        if self._sampler is not None:
            self._sampler.stop()
        if self._exchange is not None:
            self._exchange.close()
        if self._tracer is not None:
            self._stop_tracer()
        for p in self.probes:
            try:
                p.close()
            except Exception:  # noqa: BLE001
                log.debug("memwatch: probe %s failed to close", p.name, exc_info=True)

    def _final_bundle(self) -> None:
        # Before the recorder closes: an exception in flight gets its bundle first (the sinks
        # should see it), and a sink may ask for an end-of-run bundle (report + snapshot).
        if not self._sinks or self.recorder is None:
            return
        try:
            in_flight = sys.exc_info()[1]
            if in_flight is not None:
                self.recorder.handle_exception(in_flight)
            elif self._sinks.wants_final_bundle():
                self.recorder.dump("end of run (report and snapshot for the sinks)")
        except Exception as e:  # noqa: BLE001
            log.debug("memwatch: no end-of-run bundle (%s)", e)

    def __enter__(self) -> MemWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ hot path
    def step(self) -> None:
        """Record one sample. Call once per optimizer step, at the same point of every step."""
        if not self._running:
            return
        try:
            t = self._sample()
        except Exception:  # noqa: BLE001
            t = self._recover_step()
        if self.step_count >= self._next_due or t >= self._check_due_t:
            self._run_due(t)

    def _sample(self) -> float:
        vals: list[float] = []
        for p in self._fast_probes:
            vals.extend(p.read_fast())
        vals.extend(self._slow.values)  # type: ignore[union-attr]
        # Count the step only once it is stored: a failed append retries in _recover_step.
        t = time.monotonic()
        self.timeline.append(self.step_count + 1, t, vals)  # type: ignore[union-attr]
        self.step_count += 1
        return t

    def _run_due(self, t: float) -> None:
        try:
            self._schedule.run(self.step_count)
            if t >= self._check_due_t:  # (a step-based check just now pushed it back)
                self._interval_check(aligned=False)
        except Exception as e:  # noqa: BLE001 - each task guards itself; this is the backstop
            self._disable("schedule", e)
        self._next_due = self._schedule.next_due

    def _recover_step(self) -> float:
        """Slow path after a failure: find the failing probe, disable it, keep sampling."""
        try:
            for p in list(self._fast_probes):
                try:
                    got = p.read_fast()
                    if len(got) != len(p.fast_keys):
                        raise RuntimeError(
                            f"read_fast returned {len(got)} values for {len(p.fast_keys)} keys"
                        )
                except Exception as e:  # noqa: BLE001
                    self._probe_failed(p, e)
                    self._fast_probes[self._fast_probes.index(p)] = NanProbe(p)
            return self._sample()
        except Exception as e:  # noqa: BLE001
            self._disable("sampler", e)
            self._running = False
            return time.monotonic()

    def _probe_failed(self, probe: Probe, exc: BaseException) -> None:
        self._disable(f"probe {probe.name}", exc)

    def _disable(self, component: str, exc: BaseException) -> None:
        if component in self.disabled:
            return
        self.disabled[component] = f"{type(exc).__name__}: {exc}"
        log.warning("memwatch: %s disabled after an error (%s: %s); training continues",
                    component, type(exc).__name__, exc)

    # ------------------------------------------------------------------ checks
    def end_epoch(self) -> list[Finding]:
        """Close the epoch and judge it (a check): returns the new findings (never raises)."""
        if not self._running or self.timeline is None:
            return []
        try:
            summary = self.timeline.end_epoch()
        except Exception as e:  # noqa: BLE001
            self._disable("epoch summary", e)
            return []
        self.epoch += 1
        return self._check(summary, "epoch_end")

    # ------------------------------------------------------------------ reading
    def latest(self) -> dict[str, float]:
        """The last sample as a flat dict of metric -> value (bytes, counts)."""
        return self.timeline.latest() if self.timeline is not None else {}

    @property
    def epochs(self) -> list[EpochSummary]:
        return self.timeline.epochs if self.timeline is not None else []

    def limits(self) -> dict[str, float]:
        """Known byte limits per metric (device total, cgroup or physical memory).

        Inside a memory cgroup the kernel kills when the whole job (this process, its workers,
        everything else in the cgroup) fills the limit, so a host or worker metric's limit is
        its own value plus the room the cgroup has left: ``value + limit - working_set``.
        """
        out: dict[str, float] = {}
        for p in self.probes:
            try:
                out.update(p.limits())
            except Exception:  # noqa: BLE001
                continue
        latest = self.latest()
        limit, used = latest.get("cgroup.limit"), latest.get("cgroup.working_set")
        if limit and used is not None and math.isfinite(limit) and math.isfinite(used):
            room = max(0.0, limit - used)
            for m in _JOB_SHARED:
                v = latest.get(m)
                if v is not None and math.isfinite(v):
                    out[m] = min(out.get(m, math.inf), v + room)
        return out

    def after_fork_in_child(self) -> None:
        """In a forked child (a DataLoader worker), which inherits a copy of this session: it
        must not sample, write bundles or join a thread that does not exist there."""
        self._running = False
        self._closed = True
        if self._sampler is not None:
            self._sampler.forget_after_fork()
        if self.blackbox is not None:
            self.blackbox.forget_after_fork()
        if self._tracer is not None:  # tracemalloc that memwatch started: nothing reads it here
            self._tracer = None
            from memwatch.analysis.allocations import after_fork_in_child

            after_fork_in_child()

    def worker_details(self) -> list[dict[str, float]]:
        p = self._probe("workers")
        return p.per_worker() if p is not None else []

    def worker_reading(self, pid: int) -> dict[str, float] | None:
        """The last reading of DataLoader worker ``pid``, also after it died."""
        p = self._probe("workers")
        return p.last_reading(pid) if p is not None else None

    def cgroup_info(self) -> dict[str, Any] | None:
        """Which memory cgroup is watched, its version and limit, and its OOM-kill counter at
        start and now (one read); None without a cgroup probe."""
        p = self._probe("cgroup")
        if p is None:
            return None
        return {**p.describe(), "oom_kills_at_start": self._oom_kills_at_start,
                "oom_kills": p.oom_kills()}

    def _probe(self, name: str) -> Any:
        return next((p for p in self.probes if p.name == name), None)


#: Metrics whose limit, inside a memory cgroup, is what the rest of the job leaves them.
_JOB_SHARED = ("host.rss", "host.uss", "host.pss", "host.rss_anon", "host.rss_shmem",
               "workers.uss", "workers.pss", "workers.rss")

#: Every started session: a forked child (a DataLoader worker) makes its copies inert.
_in_children = ForkRegistry("after_fork_in_child")


@contextmanager
def watch(**kwargs: Any) -> Iterator[MemWatch]:
    """Context-manager form of :class:`MemWatch`: started on entry, closed on exit.

    Example::

        >>> import memwatch
        >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp)) as mw:
        ...     for _ in range(3):
        ...         mw.step()
        >>> mw.step_count
        3
    """
    mw = MemWatch(**kwargs)
    mw.start()
    try:
        yield mw
    except BaseException as e:
        mw.handle_exception(e)  # a bundle when configured; the exception propagates unchanged
        raise
    finally:
        mw.close()
