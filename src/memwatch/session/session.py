"""``MemWatch``: the one object that integrations and users drive.

Lifecycle: construct (validates configuration, raises :class:`memwatch.core.errors.ConfigError`) →
``start()`` (opens probes, starts the background sampler) → ``step()`` once per optimizer step →
``end_epoch()`` at every epoch end (verdicts) → ``close()`` (idempotent).

After ``start()`` nothing in here raises into the training loop: a failing component logs one
warning naming the cause and disables itself.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from memwatch.core.errors import ConfigError
from memwatch.core.findings import Finding
from memwatch.probes.base import DeviceProbe, Probe
from memwatch.runtime.recorder import FlightRecorder, RecorderConfig, parse_bundle_on
from memwatch.timeline.sampler import BackgroundSampler, SlowReader
from memwatch.sinks.base import SinkSet, validate_sinks  # protocol only: no upward imports
from memwatch.timeline import EpochSummary, Timeline
from memwatch.runtime.watchdog import Watchdog, parse_watchdog

log = logging.getLogger("memwatch")

#: ``MemWatch.findings`` keeps at most this many (the most recent).
MAX_FINDINGS = 1000

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|mps)(?::(\d+))?$")
DEVICE_CHOICES = "None/'auto', 'cpu', 'cuda', 'cuda:N', 'mps', or a probe such as FakeDevice"


def _validate_device(device: Any) -> Any:
    if device is None:
        return "auto"
    if isinstance(device, str):
        m = _DEVICE_RE.match(device.strip().lower())
        if not m or (m.group(2) is not None and m.group(1) != "cuda"):
            raise ConfigError(
                f"device={device!r} is not understood; use {DEVICE_CHOICES}."
            )
        return device.strip().lower()
    if type(device).__name__ == "device" and type(device).__module__.startswith("torch"):
        return _validate_device(str(device))
    if hasattr(device, "read_fast") and hasattr(device, "fast_keys"):
        return device
    raise ConfigError(f"device={device!r} is not understood; use {DEVICE_CHOICES}.")


def _positive(name: str, value: float, fix: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or (
        isinstance(value, float) and math.isinf(value)
    ):
        raise ConfigError(f"{name}={value!r} must be a positive number; {fix}.")
    return value


def _tracemalloc_frames(value: Any) -> int:
    """``tracemalloc=`` as a frame count: 0 (off), the default for True, or the int given."""
    from memwatch.analysis.allocations import DEFAULT_FRAMES, MAX_FRAMES

    if value is False:
        return 0
    if value is True:
        return DEFAULT_FRAMES
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_FRAMES:
        return value
    raise ConfigError(
        f"tracemalloc={value!r} is not understood; use False (off), True (trace Python "
        f"allocations with {DEFAULT_FRAMES} frames each) or the number of frames to keep, an "
        f"int from 1 to {MAX_FRAMES} (more frames cost more per allocation)."
    )


def rank_info() -> dict[str, int]:
    """Rank, local rank and world size: from torch.distributed when initialised, else env."""
    info = {
        "rank": int(os.environ.get("RANK", "0") or 0),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0") or 0),
        "world_size": int(os.environ.get("WORLD_SIZE", "1") or 1),
    }
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            info["rank"] = dist.get_rank()
            info["world_size"] = dist.get_world_size()
    except Exception:  # noqa: BLE001
        pass
    return info


class MemWatch:
    """Watches memory during training and turns samples into verdicts.

    Args:
        device: ``None``/``"auto"`` (CUDA if torch is imported and CUDA is available, else MPS,
            else no accelerator), ``"cpu"`` (host and workers only), ``"cuda"``, ``"cuda:N"``,
            ``"mps"``, or a device probe object such as :class:`memwatch.testing.FakeDevice`.
        host: sample this process's RSS per step and USS/PSS in the background.
        workers: sample DataLoader worker processes in the background.
        out_dir: where bundles, reports and exports go.
        interval_s: period of the background sampler (slow reads), seconds.
        capacity: raw samples kept in the ring (rows); memory is ``capacity * metrics * 8`` bytes.
        buckets_per_epoch: bucket summaries kept per epoch (even, >= 4).
        total_steps: the run's planned number of optimizer steps, if known (forecast horizon).
        analyze: run the analyzer at every ``end_epoch()``.
        census: tensor census at epoch ends: ``"auto"`` (when cheap or when growth is suspected),
            ``"always"`` or ``"never"``.
        recorder: write OOM bundles under ``<out_dir>/oom/`` (see ``docs/flight-recorder.md``).
        bundle_on: which failures write a bundle: ``"oom"`` (every OOM class, default), ``"all"``,
            ``"none"`` or a tuple of ``"cuda_oom"``, ``"host_oom"``, ``"mps_oom"``, ``"other"``.
        max_bundles, max_total_bytes: retention of ``<out_dir>/oom`` (oldest deleted first).
        max_bundle_bytes: one bundle over this is trimmed, largest optional files first.
        record_history: record the CUDA allocator's allocation history (costs a stack walk per
            allocation; makes ``snapshot.pickle`` show who allocated what).
        bundle_report: each bundle's ``report.html``: ``"full"`` (charts; plotly.js inlined,
            about 5 MB), ``"tables"`` (a few KiB), ``"none"``, or ``"auto"`` (default: full,
            but tables for the bundles a distributed job's survivors write when the launcher
            stops them with a signal). ``memwatch report BUNDLE`` draws the charts later.
        signals: SIGTERM/SIGUSR1 write a bundle, then go to the previous handler.
        watchdog: ``True`` (defaults), ``False``, a dict or a
            :class:`memwatch.runtime.watchdog.WatchdogConfig` (thresholds and actions).
        sinks: objects following :class:`memwatch.sinks.Sink` (W&B, Prometheus, JSONL...): they
            get the latest sample every ``log_every_n_steps`` steps, the findings at every epoch
            end and every bundle written; one that fails is disabled after one warning.
        log_every_n_steps: how often the sinks get a sample (optimizer steps).
        tracemalloc: trace Python allocations (``True``: 8 frames each, or the number of
            frames) and diff them by allocation site at every epoch end, so that a leak of plain
            Python objects (lists of dicts, string logs, caches of bytes or arrays) is named by
            the line that allocates it. Costs time on every Python allocation while on (see
            ``docs/benchmarks.md``); tracing the user already started is used and never stopped.

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
        sinks: Sequence[Any] | None = None,
        log_every_n_steps: int = 50,
        tracemalloc: bool | int = False,
    ) -> None:
        self._device_spec = _validate_device(device)
        self.host = bool(host)
        self.workers = bool(workers)
        self.out_dir = os.fspath(out_dir)
        if not self.out_dir:
            raise ConfigError("out_dir='' is empty; pass a directory path such as 'memwatch'.")
        self.interval_s = float(_positive("interval_s", interval_s, "for example 1.0 (seconds)"))
        if not isinstance(capacity, int) or capacity < 16:
            raise ConfigError(
                f"capacity={capacity!r} must be an int >= 16 (rows kept in the ring)."
            )
        self.capacity = capacity
        if not isinstance(buckets_per_epoch, int) or buckets_per_epoch < 4 or buckets_per_epoch % 2:
            raise ConfigError(
                f"buckets_per_epoch={buckets_per_epoch!r} must be an even int >= 4, e.g. 256."
            )
        self.buckets_per_epoch = buckets_per_epoch
        if total_steps is not None:
            _positive("total_steps", total_steps, "or None when the run length is unknown")
        self.total_steps = total_steps
        if census not in ("auto", "always", "never"):
            raise ConfigError(f"census={census!r}: use 'auto', 'always' or 'never'.")
        self.census_mode = census
        self.analyze = bool(analyze)
        self._analyzer_config = analyzer_config
        if distributed not in ("auto", "off"):
            raise ConfigError(f"distributed={distributed!r}: use 'auto' (exchange per-rank "
                              "summaries at epoch ends when torch.distributed is initialised) "
                              "or 'off'.")
        self.distributed = distributed
        self.exchange_timeout_s = float(_positive("exchange_timeout_s", exchange_timeout_s,
                                                  "for example 60 (seconds)"))
        self._exchange: Any = None
        #: On rank 0 after each epoch end: one summary per rank (None for a rank that did not
        #: answer); empty after an epoch end without an exchange (none yet, or it broke), so
        #: loggers never log the same figures twice. See memwatch.runtime.exchange.
        self.rank_summaries: list[Any] = []
        #: On rank 0: each rank's latest summary ever received (None: never), for ranks.json.
        self.rank_last_seen: list[Any] = []
        #: Which job this process belongs to (``id``, ``source``, ``attempt``): from the launcher's
        #: environment, agreed across ranks at start when running distributed. Recorded in every
        #: bundle so ``memwatch ls`` can group the bundles of one job's ranks.
        self.job: dict[str, Any] = {"id": None, "source": None, "attempt": None}
        self._recorder_config = RecorderConfig(
            enabled=bool(recorder), bundle_on=parse_bundle_on(bundle_on),
            max_bundles=max_bundles, max_bundle_bytes=max_bundle_bytes,
            max_total_bytes=max_total_bytes, record_history=bool(record_history),
            signals=bool(signals), report=bundle_report,
        )
        self._watchdog_config = parse_watchdog(watchdog)
        self.recorder: FlightRecorder | None = None
        self.watchdog: Watchdog | None = None
        #: Set by the watchdog's "stop" action; integrations map it to their framework's flag.
        self.should_stop = False
        # step() compares one int with this: the watchdog/recorder tick runs every N steps only.
        self._tick_due = sys.maxsize
        self._tick_every = (self._watchdog_config.every_n_steps
                            if self._watchdog_config is not None else 50)
        if not isinstance(log_every_n_steps, int) or isinstance(log_every_n_steps, bool) or \
                log_every_n_steps < 1:
            raise ConfigError(f"log_every_n_steps={log_every_n_steps!r} must be an int >= 1 "
                              "(how often the sinks get a sample), e.g. 50.")
        self.log_every_n_steps = log_every_n_steps
        #: Frames kept per traced allocation; 0 when ``tracemalloc=False``.
        self.tracemalloc_frames = _tracemalloc_frames(tracemalloc)
        self._tracer: Any = None  # analysis.allocations.AllocationTracer while tracing
        self._sinks = SinkSet(validate_sinks(sinks))
        # _tick_due is the earlier of these two: step() still compares a single int.
        self._watch_due = sys.maxsize
        self._sink_due = sys.maxsize

        self.device: DeviceProbe | None = None
        self.probes: list[Probe] = []
        self.timeline: Timeline | None = None
        self.findings: list[Finding] = []
        self.epoch = 0
        self.step_count = 0
        self.rank = rank_info()
        self.disabled: dict[str, str] = {}
        self._fast_probes: list[Probe] = []
        self._slow: SlowReader | None = None
        self._sampler: BackgroundSampler | None = None
        self._analyzer: Any = None
        self._running = False
        self._closed = False
        self._pid = os.getpid()
        # A checkpoint's state given before start(): applied there (see load_state_dict).
        self._pending_state: dict[str, Any] | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> MemWatch:
        """Open the probes and start the background sampler. Returns ``self``."""
        if self._running:
            return self
        if self._closed:
            raise ConfigError("this MemWatch was closed; create a new one to watch again.")
        self.device = self._resolve_device()
        probes: list[Probe] = []
        if self.device is not None:
            probes.append(self.device)
        if self.host:
            from memwatch.probes.host import HostProbe

            probes.append(HostProbe())
        if self.workers:
            from memwatch.probes.workers import WorkersProbe

            probes.append(WorkersProbe())
        self.probes = probes
        self._fast_probes = [p for p in probes if p.fast_keys]
        self._slow = SlowReader([p for p in probes if p.slow_keys], self._probe_failed)
        keys = [k for p in self._fast_probes for k in p.fast_keys] + list(self._slow.keys)
        self.timeline = Timeline(keys, capacity=self.capacity,
                                 buckets_per_epoch=self.buckets_per_epoch)
        self._slow.poll()  # values exist from the first step on
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
        _register_fork_guard(self)
        return self

    def _start_exchange(self) -> None:
        """Per-rank summaries at epoch ends (never per step) when running distributed."""
        self.rank = rank_info()  # torch.distributed may have been initialised after __init__
        from memwatch.runtime.exchange import RankExchange, dist_ready, job_identity

        try:
            self.job = job_identity()
        except Exception:  # noqa: BLE001 - an odd environment must not stop the run
            pass
        if self.distributed == "off":
            return
        dist = dist_ready()
        if dist is None:
            return
        try:
            self._exchange = RankExchange(dist, self.exchange_timeout_s, self.job)
            self.job = self._exchange.job
        except Exception as e:  # noqa: BLE001
            self._disable("rank exchange", e)

    def _resolve_device(self) -> DeviceProbe | None:
        spec = self._device_spec
        if not isinstance(spec, str):
            return spec  # type: ignore[no-any-return]
        if spec == "cpu":
            return None
        name, _, idx = spec.partition(":")
        if spec == "auto":
            # Never import torch just to look: a run that trains with torch has imported it.
            torch = sys.modules.get("torch")
            if torch is None:
                return None
            try:
                if torch.cuda.is_available():
                    from memwatch.probes.cuda import CudaProbe

                    return CudaProbe()
                if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
                    from memwatch.probes.mps import MpsProbe

                    return MpsProbe()
            except Exception as e:  # noqa: BLE001
                log.warning("memwatch: no accelerator probe (%s); watching host only", e)
            return None
        try:
            if name == "cuda":
                from memwatch.probes.cuda import CudaProbe

                return CudaProbe(int(idx) if idx else None)
            from memwatch.probes.mps import MpsProbe

            return MpsProbe()
        except (ImportError, RuntimeError) as e:
            raise ConfigError(
                f"device={spec!r} was asked for but is not usable here ({e}); use device=None to "
                "pick whatever is available, or device='cpu' to watch host memory only."
            ) from e

    def _start_recorder_and_watchdog(self) -> None:
        if self._recorder_config.enabled:
            try:
                self.recorder = FlightRecorder(self, self._recorder_config)
                self.recorder.start()
            except Exception as e:  # noqa: BLE001
                self.recorder = None
                self._disable("flight recorder", e)
        if self._watchdog_config is not None:
            self.watchdog = Watchdog(self, self._watchdog_config)
        if self.recorder is not None or self.watchdog is not None:
            self._watch_due = self.step_count + self._tick_every
        self._schedule_sinks()

    def _schedule_sinks(self) -> None:
        if self._sinks:
            # Multiples of N, so the logged steps stay aligned across a resume.
            n = self.log_every_n_steps
            self._sink_due = (self.step_count // n + 1) * n
        self._tick_due = min(self._watch_due, self._sink_due)

    def add_sink(self, sink: Any) -> None:
        """Add a :class:`memwatch.sinks.Sink` (integrations call this once they found a logger)."""
        self._sinks.add(sink)
        if self._running:
            self._schedule_sinks()

    def _tick(self) -> None:
        """Every N steps, on the training thread: sinks, watchdog, unclaimed OOM captures."""
        n = self.step_count
        if n >= self._sink_due:
            every = self.log_every_n_steps
            self._sink_due = (n // every + 1) * every
            if n % every == 0:  # not after a jump (a resume that restored step_count)
                self._sinks.metrics(n, self.latest())
        self._tick_due = min(self._watch_due, self._sink_due)
        if n < self._watch_due:
            return
        self._watch_due = n + self._tick_every
        self._tick_due = min(self._watch_due, self._sink_due)
        try:
            if self.recorder is not None:
                self.recorder.on_step_boundary()
            if self.watchdog is not None and "watchdog" not in self.disabled:
                self.watchdog.check()
        except Exception as e:  # noqa: BLE001
            self._disable("watchdog", e)
            self.watchdog = None

    def _start_analyzer(self) -> None:
        try:
            from memwatch.analysis import Analyzer
        except ImportError:
            return
        try:
            self._analyzer = Analyzer(self, self._analyzer_config)
        except Exception as e:  # noqa: BLE001
            self._disable("analyzer", e)

    def _start_tracer(self) -> None:
        if self._analyzer is None:
            log.info("memwatch: tracemalloc=%r does nothing without the analyzer (analyze=False "
                     "or it failed to start): only the analyzer reads it; not tracing",
                     self.tracemalloc_frames)
            return
        try:
            from memwatch.analysis.allocations import AllocationTracer

            self._tracer = AllocationTracer(self.tracemalloc_frames).start()
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

    def close(self) -> None:
        """Stop the sampler, release probes. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        self._running = False
        if os.getpid() != self._pid:
            return  # a forked child owns none of this
        self._tick_due = sys.maxsize
        if self._sinks:
            self._close_sinks()
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

    def __enter__(self) -> MemWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._running

    # ------------------------------------------------------------------ hot path
    def step(self) -> None:
        """Record one sample. Call once per optimizer step, at the same point of every step."""
        if not self._running:
            return
        try:
            vals: list[float] = []
            for p in self._fast_probes:
                vals.extend(p.read_fast())
            vals.extend(self._slow.values)  # type: ignore[union-attr]
            # Count the step only once it is stored: a failed append retries in _recover_step.
            self.timeline.append(self.step_count + 1, time.monotonic(), vals)  # type: ignore[union-attr]
            self.step_count += 1
        except Exception:  # noqa: BLE001
            self._recover_step()
        if self.step_count >= self._tick_due:
            self._tick()

    def _recover_step(self) -> None:
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
                    i = self._fast_probes.index(p)
                    nan_probe = _NanProbe(p)
                    self._fast_probes[i] = nan_probe
            vals: list[float] = []
            for p in self._fast_probes:
                vals.extend(p.read_fast())
            vals.extend(self._slow.values)  # type: ignore[union-attr]
            self.timeline.append(self.step_count + 1, time.monotonic(), vals)  # type: ignore[union-attr]
            self.step_count += 1
        except Exception as e:  # noqa: BLE001
            self._disable("sampler", e)
            self._running = False

    def _probe_failed(self, probe: Probe, exc: BaseException) -> None:
        self._disable(f"probe {probe.name}", exc)

    def _disable(self, component: str, exc: BaseException) -> None:
        if component in self.disabled:
            return
        self.disabled[component] = f"{type(exc).__name__}: {exc}"
        log.warning("memwatch: %s disabled after an error (%s: %s); training continues",
                    component, type(exc).__name__, exc)

    # ------------------------------------------------------------------ epochs
    def end_epoch(self) -> list[Finding]:
        """Close the epoch: summarise it and return the new findings (never raises)."""
        if not self._running or self.timeline is None:
            return []
        try:
            if self._slow is not None:
                self._slow.poll()  # fresh USS/PSS and worker readings for the verdicts
            summary = self.timeline.end_epoch()
        except Exception as e:  # noqa: BLE001
            self._disable("epoch summary", e)
            return []
        self.epoch += 1
        if summary is not None and self._tracer is not None:
            try:  # before the analyzer, which reads the diff
                self._tracer.epoch_end(summary.epoch, self.step_count,
                                       self.latest().get("host.rss"))
            except Exception as e:  # noqa: BLE001
                self._stop_tracer(e)
        new: list[Finding] = []
        if summary is not None and self._analyzer is not None \
                and "analyzer" not in self.disabled:
            try:
                new = list(self._analyzer.on_epoch_end(summary))
            except Exception as e:  # noqa: BLE001
                self._disable("analyzer", e)
        new = self._exchange_ranks(new, summary)  # every rank, even after an empty epoch
        if summary is None:
            return new
        self.findings.extend(new)
        if len(self.findings) > MAX_FINDINGS:
            # Bounded whatever the run length: the oldest findings go first (every one was also
            # returned by its end_epoch() and handed to the sinks when it was new).
            del self.findings[: len(self.findings) - MAX_FINDINGS]
        if self.watchdog is not None and new and "watchdog" not in self.disabled:
            try:
                self.watchdog.on_findings(new)
            except Exception as e:  # noqa: BLE001
                self._disable("watchdog", e)
        if self._sinks:
            self._sinks.findings(summary.epoch, new, summary)
        return new

    # ------------------------------------------------------------------ sinks
    def _bundle_written(self, path: Path, manifest: dict[str, Any]) -> None:
        """The flight recorder's report of a committed (redacted) bundle: hand it to the sinks."""
        if self._sinks:
            self._sinks.bundle(path, manifest)

    def _close_sinks(self) -> None:
        # Before the recorder closes: an exception in flight gets its bundle first (the sinks
        # should see it), and a sink may ask for an end-of-run bundle (report + snapshot).
        try:
            in_flight = sys.exc_info()[1]
            if in_flight is not None and self.recorder is not None:
                self.recorder.handle_exception(in_flight)
            elif self.recorder is not None and self._sinks.wants_final_bundle():
                self.recorder.dump("end of run (report and snapshot for the sinks)")
        except Exception as e:  # noqa: BLE001
            log.debug("memwatch: no end-of-run bundle (%s)", e)
        self._sinks.close()

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

    def _exchange_ranks(self, new: list[Finding], summary: EpochSummary | None) -> list[Finding]:
        if self.rank.get("world_size", 1) > 1:
            for f in new:
                f.rank = self.rank.get("rank", 0)
        ex = self._exchange
        if ex is None or "rank exchange" in self.disabled:
            return new
        try:
            from memwatch.runtime.exchange import cross_rank_findings, rank_payload

            self.rank_summaries = []
            got = ex.exchange(rank_payload(self, new, summary))
            if got is not None:  # rank 0
                self.rank_summaries = got
                last = self.rank_last_seen + [None] * (len(got) - len(self.rank_last_seen))
                self.rank_last_seen = [g if g is not None else prev
                                       for g, prev in zip(got, last[:len(got)], strict=True)]
                return new + cross_rank_findings(got, ex.missing, self.exchange_timeout_s)
        except Exception as e:  # noqa: BLE001
            self._disable("rank exchange", e)
        return new

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this session, so a resumed run's verdicts span the restart.

        Plain data only (see :mod:`memwatch.runtime.resume`): JSON-serialisable with ``allow_nan=False``
        and loadable with ``torch.load(weights_only=True)``. Holds the timeline's epoch summaries
        (with their metric names), ``step_count``, ``epoch`` and :attr:`findings`. Never raises.

        Example::

            >>> import json, memwatch
            >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp)) as mw:
            ...     for _ in range(4):
            ...         mw.step()
            ...     _ = mw.end_epoch()
            >>> state = json.loads(json.dumps(mw.state_dict(), allow_nan=False))
            >>> resumed = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp))
            >>> resumed.load_state_dict(state)  # before or after start()
            >>> with resumed:
            ...     resumed.step()
            >>> resumed.step_count, [e.epoch for e in resumed.epochs]
            (5, [0])
        """
        from memwatch.runtime.resume import STATE_VERSION, plain, summary_to_state

        empty = {"version": STATE_VERSION, "step_count": int(self.step_count),
                 "epoch": int(self.epoch), "epochs": [], "findings": []}
        if self.timeline is None:
            # Not started yet: a state loaded but not applied is still this session's state.
            return plain(self._pending_state) if self._pending_state is not None else empty
        try:
            return {
                "version": STATE_VERSION,
                "step_count": int(self.step_count),
                "epoch": int(self.epoch),
                "epochs": [summary_to_state(e) for e in self.timeline.epochs],
                "findings": [plain(f.to_dict()) for f in self.findings],
            }
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: could not export the session state (%s: %s); the checkpoint "
                        "keeps the step count only", type(e).__name__, e)
            return empty

    def load_state_dict(self, state: Any) -> None:
        """Continue from a :meth:`state_dict` saved before a restart.

        Works before ``start()`` (the state is applied there) or after it, as long as this
        session has not closed an epoch yet. Restores the epoch summaries into the timeline
        (metric columns remapped by name: a metric this run lacks is dropped, a new one is NaN
        in the restored epochs), replays them through the analyzer so cross-epoch verdicts span
        the restart (their findings were reported before it: they are not returned again),
        restores :attr:`findings` and continues the step numbering. A state that cannot be used
        (another version, malformed) logs a warning and the session starts fresh; this never
        raises.
        """
        if self.timeline is None:
            self._pending_state = state if isinstance(state, dict) else {"version": None}
            return
        self._apply_state(state)

    def _apply_state(self, state: Any) -> None:
        from memwatch.runtime.resume import STATE_VERSION, epochs_from_state

        tl = self.timeline
        if tl is None:
            return
        version = state.get("version") if isinstance(state, dict) else None
        if version != STATE_VERSION:
            log.warning("memwatch: checkpoint state version %r is not one this memwatch reads "
                        "(%d); the analysis starts fresh", version, STATE_VERSION)
            return
        if tl.epochs:
            log.warning("memwatch: checkpoint state given after this session closed an epoch; "
                        "not restored (load it before the first epoch end)")
            return
        try:  # everything is checked before anything changes
            epochs = epochs_from_state(state.get("epochs") or [], tl.keys)
            findings = [Finding.from_dict(d) for d in state.get("findings") or []]
            step_count = int(state.get("step_count") or 0)
            epoch = int(state.get("epoch") or 0)
            if epochs and epochs[-1].end_step > step_count:
                raise ValueError(f"last epoch ends at step {epochs[-1].end_step}, after the "
                                 f"saved step count {step_count}")
        except Exception as e:  # noqa: BLE001 - a bad state must not stop the resumed run
            log.warning("memwatch: checkpoint state not usable (%s: %s); the analysis starts "
                        "fresh", type(e).__name__, e)
            return
        tl.restore_epochs(epochs)
        self.findings = findings + self.findings
        del self.findings[: max(len(self.findings) - MAX_FINDINGS, 0)]
        # One step axis across the restart: the analyzer's slopes and forecasts read it.
        self.step_count = max(self.step_count, step_count)
        self.epoch = max(self.epoch, epoch, epochs[-1].epoch + 1 if epochs else 0)
        self._replay(epochs)
        if self._running:  # the ticks were scheduled from the old step count
            if self.recorder is not None or self.watchdog is not None:
                self._watch_due = self.step_count + self._tick_every
            self._schedule_sinks()
        log.info("memwatch: resumed from a checkpoint: %d epoch(s), %d finding(s), step %d",
                 len(epochs), len(findings), self.step_count)

    def _replay(self, epochs: Sequence[EpochSummary]) -> None:
        """Feed restored epochs to the analyzer (its per-metric history and the findings it
        reports once); what it finds is dropped: it was reported before the restart."""
        analyzer = self._analyzer
        detailed = [e for e in epochs if e.bucket_floor is not None]  # what a verdict reads
        if analyzer is None or "analyzer" in self.disabled or not detailed:
            return
        # The allocation tracer's diffs belong to this process's epochs, not the restored ones.
        tracer, self._tracer = self._tracer, None
        mode = self.census_mode
        try:
            for i, e in enumerate(detailed):
                # A census counts the objects alive now: taken once, at the last restored epoch,
                # it is the baseline the first epoch end after the restart compares with.
                self.census_mode = mode if i == len(detailed) - 1 else "never"
                analyzer.on_epoch_end(e)
        except Exception as exc:  # noqa: BLE001
            log.warning("memwatch: the analyzer could not replay the restored epochs (%s: %s); "
                        "verdicts start fresh", type(exc).__name__, exc)
            self._analyzer = None
            self._start_analyzer()
        finally:
            self.census_mode = mode
            self._tracer = tracer

    # ------------------------------------------------------------------ reading
    def latest(self) -> dict[str, float]:
        """The last sample as a flat dict of metric -> value (bytes, counts)."""
        return self.timeline.latest() if self.timeline is not None else {}

    @property
    def epochs(self) -> list[EpochSummary]:
        return self.timeline.epochs if self.timeline is not None else []

    def limits(self) -> dict[str, float]:
        """Known byte limits per metric (device total, cgroup or physical memory)."""
        out: dict[str, float] = {}
        for p in self.probes:
            try:
                out.update(p.limits())
            except Exception:  # noqa: BLE001
                continue
        return out

    def worker_details(self) -> list[dict[str, float]]:
        for p in self.probes:
            if p.name == "workers":
                return p.per_worker()  # type: ignore[attr-defined,no-any-return]
        return []


class _NanProbe:
    """Stands in for a disabled fast probe so the timeline keeps its columns (NaN)."""

    def __init__(self, failed: Probe) -> None:
        self.name = failed.name
        self.fast_keys = failed.fast_keys
        self.slow_keys: tuple[str, ...] = ()
        self._vals = (math.nan,) * len(failed.fast_keys)

    def read_fast(self) -> Sequence[float]:
        return self._vals

    def read_slow(self) -> dict[str, float]:
        return {}

    def limits(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None


_live_sessions: weakref.WeakSet[MemWatch] = weakref.WeakSet()
_fork_hook_installed = False


def _after_fork_in_child() -> None:
    # A DataLoader worker inherits a copy of every session; it must not sample, write bundles or
    # join a thread that does not exist in the child.
    tracing = False
    for s in list(_live_sessions):
        s._running = False
        s._closed = True
        if s._sampler is not None:
            s._sampler.forget_after_fork()
        tracing = tracing or s._tracer is not None
        s._tracer = None
    if tracing:  # tracemalloc that memwatch started: nothing reads it in the child
        from memwatch.analysis.allocations import after_fork_in_child

        after_fork_in_child()


def _register_fork_guard(session: MemWatch) -> None:
    global _fork_hook_installed
    _live_sessions.add(session)
    if not _fork_hook_installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook_installed = True


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
