"""The session's options as one validated value: :class:`WatchConfig`.

``MemWatch(**options)`` builds one; ``MemWatch.config`` is it. Every bad value raises
:class:`memwatch.ConfigError` (a ``ValueError``) at construction, naming the option and the fix,
so a typo fails before training starts, not in the middle of it.

Example::

    >>> from memwatch import WatchConfig
    >>> cfg = WatchConfig(device="CUDA:1", census="always")
    >>> cfg.device_spec, cfg.census
    ('cuda:1', 'always')
    >>> WatchConfig(interval_s=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memwatch.core.errors.ConfigError: interval_s=0 must be a positive number; ...
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from memwatch.analysis.context import AnalyzerConfig
from memwatch.analysis.culprits.allocations import DEFAULT_FRAMES, MAX_FRAMES
from memwatch.core.errors import ConfigError
from memwatch.core.findings import STAGES
from memwatch.core.safefs import modes
from memwatch.runtime.dispatch import SinkSet, validate_sinks
from memwatch.runtime.recorder import RecorderConfig, parse_bundle_on
from memwatch.runtime.watchdog import WatchdogConfig, parse_watchdog

__all__ = ["DEVICE_CHOICES", "WatchConfig"]

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|mps)(?::(\d+))?$")
#: The background sampler's period when ``interval_s`` is left to memwatch (paced).
DEFAULT_INTERVAL_S = 1.0
DEVICE_CHOICES = "None/'auto', 'cpu', 'cuda', 'cuda:N', 'mps', or a probe such as FakeDevice"


def _device_spec(device: Any) -> Any:
    if device is None:
        return "auto"
    if isinstance(device, str):
        m = _DEVICE_RE.match(device.strip().lower())
        if not m or (m.group(2) is not None and m.group(1) != "cuda"):
            raise ConfigError(f"device={device!r} is not understood; use {DEVICE_CHOICES}.")
        return device.strip().lower()
    if type(device).__name__ == "device" and type(device).__module__.startswith("torch"):
        return _device_spec(str(device))
    if hasattr(device, "read_fast") and hasattr(device, "fast_keys"):
        return device
    raise ConfigError(f"device={device!r} is not understood; use {DEVICE_CHOICES}.")


def _positive(name: str, value: Any, fix: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or (
        isinstance(value, float) and math.isinf(value)
    ):
        raise ConfigError(f"{name}={value!r} must be a positive number; {fix}.")
    return float(value)


def _positive_int(name: str, value: Any, fix: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a positive number (an int); {fix}.")
    return value


def _bool(name: str, value: Any) -> bool:
    # ``recorder='off'`` is truthy: a string or a number must never turn a feature on.
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} must be True or False.")
    return value


def _choice(name: str, value: Any, choices: tuple[str, ...], why: str = "") -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{name}={value!r}: use one of {', '.join(map(repr, choices))}"
                          + (f" ({why})" if why else "") + ".")
    return value


#: Bytes of the ring per row and metric column (float64), and the most metric columns a session
#: has (device, host, RSS parts, workers, cgroup): what ``capacity`` costs.
_ROW_BYTES = 8 * 64


def _capacity(value: Any) -> int:
    """Rows kept in the ring: at least 16, and a ring that takes at most a quarter of the
    machine's memory (``capacity=10**10`` would fail at start with MemoryError)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 16:
        raise ConfigError(f"capacity={value!r} must be an int >= 16 (rows kept in the ring), "
                          "e.g. 32768.")
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 - unknown machine: a fixed bound
        total = 1 << 36
    most = max(16, total // 4 // _ROW_BYTES)
    if value > most:
        raise ConfigError(f"capacity={value} rows would take up to {value * _ROW_BYTES >> 20} "
                          f"MiB; this machine allows at most {most} (a quarter of its memory), "
                          "and the default 32768 keeps every step of long epochs in summaries "
                          "anyway.")
    return value


_SPECIAL_DIRS = ("/proc", "/sys", "/dev")


def _out_dir(value: Any) -> str:
    """A path, not an existing file, not under /proc, /sys or /dev (the evidence would be lost
    at the crash). Ownership and permissions are checked when the session starts."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"out_dir={value!r} must be a directory path such as 'memwatch'.")
    out = os.fspath(value)
    if not isinstance(out, str) or not out:
        raise ConfigError("out_dir='' is empty; pass a directory path such as 'memwatch'.")
    full = os.path.realpath(os.path.abspath(out))
    special = next((d for d in _SPECIAL_DIRS if full == d or full.startswith(d + os.sep)), None)
    if special is not None:
        raise ConfigError(f"out_dir={out!r} is under {special}, a kernel file system where "
                          "bundles cannot be kept; pass a directory on disk such as "
                          "'./memwatch'.")
    if os.path.exists(full) and not os.path.isdir(full):
        raise ConfigError(f"out_dir={out!r} exists and is not a directory; pass a directory "
                          "path (it is created when missing).")
    return out


def _tracemalloc_frames(value: Any) -> int:
    """``tracemalloc=`` as a frame count: 0 (off), the default for True, or the int given."""
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


@dataclasses.dataclass(frozen=True)
class WatchConfig:
    """Every option of :class:`memwatch.MemWatch`, validated: ``MemWatch(**options)`` builds one.

    Normalised on construction (``device`` to a spec or a probe, ``bundle_on`` to a set of
    classes, ``watchdog`` to a :class:`memwatch.WatchdogConfig` or ``None``, ``sinks`` to a
    tuple); ``dataclasses.replace(cfg, ...)`` re-validates.

    Args:
        device: ``None``/``"auto"`` (CUDA if torch is imported and CUDA is available, else MPS,
            else no accelerator), ``"cpu"`` (host and workers only), ``"cuda"``, ``"cuda:N"``,
            ``"mps"``, or a device probe object such as :class:`memwatch.testing.FakeDevice`.
        host: sample this process's RSS per step and USS/PSS in the background.
        workers: sample DataLoader worker processes in the background.
        out_dir: where bundles, reports and exports go.
        interval_s: period of the background sampler (slow reads), seconds. ``None``
            (default): every second, and longer after a pass whose CPU time would take more than
            0.5% of a core at that pace (``smaps_rollup`` walks the page tables: about 20 ms a
            pass per GiB of RSS), so that a large process is not slowed by its own watching. A
            number is kept as given, whatever a pass costs.
        capacity: raw samples kept in the ring (rows); memory is ``capacity * metrics * 8`` bytes.
        buckets_per_epoch: bucket summaries kept per epoch (even, >= 4).
        total_steps: the run's planned number of optimizer steps, if known (forecast horizon).
        analyze: run the analyzer at every ``end_epoch()``. ``mw.analyzer`` is the analyzer
            (any object with ``check(summary, context) -> list[Finding]`` may replace it).
        census: tensor census at epoch ends: ``"auto"`` (when cheap or when growth is suspected),
            ``"always"`` or ``"never"``.
        recorder: write OOM bundles under ``<out_dir>/oom/`` (see ``docs/flight-recorder.md``).
        bundle_on: which failures write a bundle: ``"oom"`` (default: every OOM class, and
            ``"peer_failure"``, a collective that failed because another rank died), ``"all"``,
            ``"none"`` or a tuple of ``"cuda_oom"``, ``"host_oom"``, ``"mps_oom"``,
            ``"peer_failure"``, ``"other"``.
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
            :class:`memwatch.WatchdogConfig` (thresholds and actions).
        sinks: objects following :class:`memwatch.sinks.Sink` (W&B, Prometheus, JSONL...): they
            get the latest sample every ``log_every_n_steps`` steps, the findings at every epoch
            end and every bundle written; one that fails is disabled after one warning. A
            :class:`memwatch.sinks.SinkSet` is shared as it is (its owner closes it).
        log_every_n_steps: how often the sinks get a sample (optimizer steps).
        stage: the loop this session watches: ``"train"`` (default), or ``"val"``, ``"test"``,
            ``"predict"`` for an evaluation session beside training (its findings say so; it
            sends no per-step samples to the sinks).
        tracemalloc: trace Python allocations (``True``: 8 frames each, or the number of
            frames) and diff them by allocation site at every epoch end, so that a leak of plain
            Python objects (lists of dicts, string logs, caches of bytes or arrays) is named by
            the line that allocates it. Costs time on every Python allocation while on (see
            ``docs/benchmarks.md``); tracing the user already started is used and never stopped.
        blackbox_every_s: how often the black box (``<out_dir>/blackbox/``: the record that
            survives SIGKILL and the kernel's OOM killer) is rewritten, seconds; ``None``: none.
        check_every_n_steps, check_every_s: a check (verdicts) inside the epoch every N optimizer
            steps and/or every T seconds, whichever comes first; ``None`` turns one off (both
            ``None``: checks at epoch ends only). Every epoch end is a check too. The defaults
            (5,000 steps, 600 s) give a 100k-step run of one epoch its first verdicts within
            about half an hour at any speed (a leak is confirmed at the second or third check
            after it starts): see ``docs/findings.md``. Only step-based checks exchange summaries
            across ranks (every rank reaches the same step; the clocks of ranks differ).
        horizon_s: when the run's length is unknown, growth that would reach the limit within
            this much wall time is a ``warning`` (default: 3 days); slower growth is ``info``.
        steps_per_epoch: the epoch length, when known (the adapters set it): in the first epoch
            of a run planned to have more, checks inside it leave leak verdicts to its end (only
            an epoch end tells a leak from epoch-scoped accumulation).
        share: who may read what memwatch writes under ``out_dir``: ``"private"`` (default:
            directories 0700, files 0600) or ``"group"`` (0750/0640: the directory's group may
            read bundles and records, never write them). See ``docs/security.md``.
        warn: a :class:`memwatch.MemWatchWarning` for each new finding of severity warning or
            critical that a check inside an epoch makes (``step()`` cannot return them; the
            findings of ``end_epoch()`` are returned). The adapters warn themselves.
    """

    device: Any = None
    host: bool = True
    workers: bool = True
    out_dir: str | os.PathLike[str] = "memwatch"
    interval_s: float | None = None
    capacity: int = 32768
    buckets_per_epoch: int = 256
    total_steps: int | None = None
    analyze: bool = True
    census: str = "auto"
    analyzer_config: Any = None
    distributed: str = "auto"
    exchange_timeout_s: float = 60.0
    recorder: bool = True
    bundle_on: Any = "oom"
    max_bundles: int = 20
    max_bundle_bytes: int = 256 << 20
    max_total_bytes: int = 1 << 30
    record_history: bool = False
    signals: bool = True
    bundle_report: str = "auto"
    watchdog: Any = True
    sinks: Sequence[Any] | SinkSet | None = None
    log_every_n_steps: int = 50
    tracemalloc: bool | int = False
    #: The loop this session watches: "train" (default), or "val"/"test"/"predict" for the
    #: evaluation sessions an integration runs beside training. It is recorded in every finding.
    stage: str = "train"
    check_every_n_steps: int | None = 5000
    check_every_s: float | None = 600.0
    horizon_s: float = 3 * 86400.0
    steps_per_epoch: int | None = None
    warn: bool = True
    blackbox_every_s: float | None = 5.0
    share: str = "private"

    def __post_init__(self) -> None:
        s = object.__setattr__
        s(self, "device", _device_spec(self.device))
        s(self, "out_dir", _out_dir(self.out_dir))
        for name in ("host", "workers", "analyze", "recorder", "record_history", "signals",
                     "warn"):
            _bool(name, getattr(self, name))
        if self.interval_s is not None:
            s(self, "interval_s", _positive("interval_s", self.interval_s,
                                            "for example 1.0 (seconds), or None (paced)"))
        _capacity(self.capacity)
        b = self.buckets_per_epoch
        if not isinstance(b, int) or isinstance(b, bool) or not 4 <= b <= 65536 or b % 2:
            raise ConfigError(f"buckets_per_epoch={b!r} must be an even int from 4 to 65536, "
                              "e.g. 256.")
        if self.total_steps is not None:
            _positive_int("total_steps", self.total_steps,
                          "or None when the run length is unknown")
        _choice("census", self.census, ("auto", "always", "never"))
        if self.analyzer_config is not None and \
                not isinstance(self.analyzer_config, AnalyzerConfig):
            raise ConfigError(f"analyzer_config={self.analyzer_config!r} must be a "
                              "memwatch.AnalyzerConfig (e.g. AnalyzerConfig(near_oom_margin="
                              "0.05)) or None for the defaults.")
        _choice("distributed", self.distributed, ("auto", "off"),
                "'auto' exchanges per-rank summaries at checks when torch.distributed is "
                "initialised")
        s(self, "exchange_timeout_s", _positive("exchange_timeout_s", self.exchange_timeout_s,
                                                "for example 60 (seconds)"))
        s(self, "bundle_on", parse_bundle_on(self.bundle_on))
        s(self, "watchdog", parse_watchdog(self.watchdog))
        n = self.log_every_n_steps
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"log_every_n_steps={n!r} must be an int >= 1 (how often the "
                              "sinks get a sample), e.g. 50.")
        _tracemalloc_frames(self.tracemalloc)
        every = self.check_every_n_steps
        if every is not None and (not isinstance(every, int) or isinstance(every, bool)
                                  or every < 16):
            raise ConfigError(f"check_every_n_steps={every!r} must be an int >= 16 (a check "
                              "needs a few points to see a trend), or None for checks at epoch "
                              "ends and by time only; e.g. 5000.")
        if self.check_every_s is not None:
            s(self, "check_every_s", _positive("check_every_s", self.check_every_s,
                                               "for example 600 (seconds), or None"))
        s(self, "horizon_s", _positive("horizon_s", self.horizon_s,
                                       "for example 259200 (3 days, in seconds)"))
        if self.blackbox_every_s is not None:
            s(self, "blackbox_every_s", _positive(
                "blackbox_every_s", self.blackbox_every_s,
                "for example 5 (seconds between rewrites of the black box), or None for none"))
        if self.steps_per_epoch is not None:
            _positive_int("steps_per_epoch", self.steps_per_epoch,
                          "or None when it is not known")
        _choice("stage", self.stage, tuple(STAGES))
        modes(self.share)  # ConfigError naming share= and its values
        if not isinstance(self.sinks, SinkSet):
            s(self, "sinks", tuple(validate_sinks(self.sinks)))
        self.recorder_config  # noqa: B018 - validates the recorder's options now

    @property
    def device_spec(self) -> Any:
        """``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a probe object."""
        return self.device

    @property
    def tracemalloc_frames(self) -> int:
        """Frames kept per traced allocation; 0 when tracing is off."""
        return _tracemalloc_frames(self.tracemalloc)

    @property
    def recorder_config(self) -> RecorderConfig:
        return RecorderConfig(
            enabled=bool(self.recorder), bundle_on=self.bundle_on,
            max_bundles=self.max_bundles, max_bundle_bytes=self.max_bundle_bytes,
            max_total_bytes=self.max_total_bytes, record_history=bool(self.record_history),
            signals=bool(self.signals), report=self.bundle_report, share=self.share)

    @property
    def watchdog_config(self) -> WatchdogConfig | None:
        return self.watchdog  # type: ignore[no-any-return]

    @property
    def sample_every_s(self) -> float:
        """The background sampler's base period: ``interval_s``, or 1 s when it is paced."""
        return DEFAULT_INTERVAL_S if self.interval_s is None else self.interval_s

    def for_evaluation(self, stage: str) -> WatchConfig:
        """The configuration of an evaluation session beside this one: same probes and
        analysis, its own stage, and no flight recorder, signals, watchdog or logging cadence of
        its own (one process, one flight recorder: the training session owns them)."""
        # A list of sinks belongs to the training session (which closes them); a shared
        # SinkSet (what the integrations pass) is closed by its owner and serves both.
        sinks = self.sinks if isinstance(self.sinks, SinkSet) else None
        # An evaluation loop is judged at its end: no checks inside it.
        return dataclasses.replace(self, stage=stage, recorder=False, signals=False,
                                   watchdog=False, total_steps=None, sinks=sinks,
                                   check_every_n_steps=None, check_every_s=None,
                                   steps_per_epoch=None)

    def options(self) -> dict[str, Any]:
        """The options as keyword arguments of :class:`memwatch.MemWatch`."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
