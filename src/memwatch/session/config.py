"""The session's options as one validated value: :class:`WatchConfig`, where every option is
declared once.

An option is one field of :class:`WatchConfig`: its type and default, the comment that documents
it, how its value is checked, and how ``memwatch run`` takes it (its :class:`Flag`, if any).
``MemWatch(**options)`` builds one; ``MemWatch.config`` is it. Every bad value raises
:class:`memwatch.ConfigError` (a ``ValueError``) at construction, naming the option and the fix,
so a typo fails before training starts, not in the middle of it. What else names the options is
made from these fields or checked against them (``tests/session/test_options.py``,
``tests/test_architecture.py``): ``memwatch run``'s flags (:func:`flags`), the keyword types
(:mod:`memwatch.session.options`) and the tables of ``docs/configuration.md``.

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
import os
from collections.abc import Sequence
from typing import Any, TypeVar

from memwatch.analysis.context import AnalyzerConfig
from memwatch.core.findings import STAGES
from memwatch.runtime.dispatch import SinkSet
from memwatch.runtime.recorder import RecorderConfig, parse_bundle_on
from memwatch.runtime.watchdog import WatchdogConfig, parse_watchdog
from memwatch.session import validate as v
from memwatch.session.validate import DEVICE_CHOICES

__all__ = ["CHECK_CAP_STEPS", "DEVICE_CHOICES", "Flag", "OptionSpec", "WatchConfig", "flags",
           "spec"]

#: The background sampler's period when ``interval_s`` is left to memwatch (paced).
DEFAULT_INTERVAL_S = 1.0
#: ``check_every_n_steps="auto"``: the longest interval of the checks sized to the run (steps).
CHECK_CAP_STEPS = 5000
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Flag:
    """How ``memwatch run`` takes an option.

    Attributes:
        name: the flag (``"--check-every-n-steps"``).
        kind: how its value is read: ``"str"``, ``"int"``, ``"float"`` (``"int?"``,
            ``"float?"``: ``none`` too; ``"steps"``: an int, ``none`` or ``auto``),
            ``"on"``/``"off"`` (a flag alone sets the option
            True/False), ``"frames"`` (alone, or with a number: ``--tracemalloc``).
        help: its line in ``memwatch run --help``.
    """

    name: str
    kind: str
    help: str


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """What a field of :class:`WatchConfig` says besides its type and default."""

    check: v.Check | None = None
    flag: Flag | None = None
    #: Passed on by the adapters' ``**options`` (``log_every_n_steps`` and ``warn`` are
    #: arguments of the adapters' own).
    adapter: bool = True


_SPEC = "memwatch.option"


def option(default: T, check: v.Check | None = None, flag: Flag | None = None,
           adapter: bool = True) -> T:
    """A field of :class:`WatchConfig`: its default, its check, its flag."""
    meta = {_SPEC: OptionSpec(check, flag, adapter)}
    return dataclasses.field(default=default, metadata=meta)


def spec(f: dataclasses.Field[Any]) -> OptionSpec:
    """The :class:`OptionSpec` of one of :class:`WatchConfig`'s fields."""
    return f.metadata.get(_SPEC) or OptionSpec()


@dataclasses.dataclass(frozen=True)
class WatchConfig:
    """Every option of :class:`memwatch.MemWatch`, validated: ``MemWatch(**options)`` builds one.

    Normalised on construction (``device`` to a spec or a probe, ``bundle_on`` to a set of
    classes, ``watchdog`` to a :class:`memwatch.WatchdogConfig` or ``None``, ``sinks`` to a
    tuple); ``dataclasses.replace(cfg, ...)`` re-validates. Each field's comment says what the
    option does (``docs/configuration.md`` has the same, at more length).
    """

    #: ``None``/``"auto"`` (CUDA if torch is imported and CUDA is available, else MPS, else no
    #: accelerator), ``"cpu"`` (host and workers only), ``"cuda"``, ``"cuda:N"``, ``"mps"``, or
    #: a device probe object such as :class:`memwatch.testing.FakeDevice`.
    device: Any = option(None, v.device,
                         Flag("--device", "str", "auto (default), cpu, cuda, cuda:N or mps"))
    #: Sample this process's RSS per step and USS/PSS in the background.
    host: bool = option(True, v.flag, Flag("--no-host", "off",
                                           "do not sample this process's memory"))
    #: Sample DataLoader worker processes in the background.
    workers: bool = option(True, v.flag, Flag("--no-workers", "off",
                                              "do not sample DataLoader workers"))
    #: Where bundles, reports and exports go.
    out_dir: str | os.PathLike[str] = option(
        "memwatch", v.out_dir,
        Flag("--out-dir", "str", "where bundles, the black box and report.html go"))
    #: Period of the background sampler (slow reads), seconds. ``None`` (default): every
    #: second, and longer after a pass whose CPU time would take more than 0.5% of a core at
    #: that pace (``smaps_rollup`` walks the page tables: about 20 ms a pass per GiB of RSS), so
    #: that a large process is not slowed by its own watching. A number is kept as given,
    #: whatever a pass costs.
    interval_s: float | None = option(
        None, v.optional(v.positive("for example 1.0 (seconds), or None (paced)")),
        Flag("--interval-s", "float", "background sampler period, seconds (default 1)"))
    #: Raw samples kept in the ring (rows); memory is ``capacity * metrics * 8`` bytes.
    capacity: int = option(32768, v.capacity,
                           Flag("--capacity", "int", "raw samples kept in the ring (default "
                                "32768)"))
    #: Bucket summaries kept per epoch (even, >= 4).
    buckets_per_epoch: int = option(256, v.even_buckets,
                                    Flag("--buckets-per-epoch", "int",
                                         "bucket summaries per epoch (256)"))
    #: The run's planned number of optimizer steps, if known (forecast horizon).
    total_steps: int | None = option(
        None, v.optional(v.positive_int("or None when the run length is unknown")),
        Flag("--total-steps", "int?",
             "the run's planned optimizer steps: a leak is a warning when it can kill the run"))
    #: Run the analyzer at every check. ``mw.analyzer`` is the analyzer (any object with
    #: ``check(summary, context) -> list[Finding]`` may replace it).
    analyze: bool = option(True, v.flag, Flag("--no-analyze", "off",
                                              "sample only: no verdicts"))
    #: Tensor census at checks: ``"auto"`` (when cheap or when growth is suspected),
    #: ``"always"`` or ``"never"``.
    census: str = option("auto", v.choice("auto", "always", "never"),
                         Flag("--census", "str",
                              "live-tensor census at checks: auto (default), always, never"))
    #: The analyzer's tuning (a :class:`memwatch.AnalyzerConfig`; ``None``: the defaults).
    analyzer_config: AnalyzerConfig | None = option(None, v.analyzer_config)
    #: ``"auto"``: exchange per-rank summaries at checks when ``torch.distributed`` is
    #: initialised; ``"off"``.
    distributed: str = option(
        "auto", v.choice("auto", "off", why="'auto' exchanges per-rank summaries at checks when "
                         "torch.distributed is initialised"),
        Flag("--distributed", "str", "auto (default) or off: per-rank summaries at checks"))
    #: How long ranks wait for each other's summaries at a check, seconds.
    exchange_timeout_s: float = option(
        60.0, v.positive("for example 60 (seconds)"),
        Flag("--exchange-timeout-s", "float",
             "how long ranks wait for each other at checks (default 60)"))
    #: Write OOM bundles under ``<out_dir>/oom/`` (see ``docs/flight-recorder.md``).
    recorder: bool = option(True, v.flag, Flag("--no-recorder", "off",
                                               "no bundle when the script dies"))
    #: Which failures write a bundle: ``"oom"`` (default: every OOM class, and
    #: ``"peer_failure"``, a collective that failed because another rank died), ``"all"``,
    #: ``"none"`` or a tuple of ``"cuda_oom"``, ``"host_oom"``, ``"mps_oom"``,
    #: ``"peer_failure"``, ``"other"``.
    bundle_on: Any = option(
        "oom", lambda name, value: parse_bundle_on(value),
        Flag("--bundle-on", "str", "failures that write a bundle: oom (default: every OOM and "
             "peer_failure), all, none, or a comma list of cuda_oom, host_oom, mps_oom, "
             "peer_failure, other"))
    #: Retention of ``<out_dir>/oom`` by count (this run's bundles, oldest deleted first).
    max_bundles: int = option(20, flag=Flag("--max-bundles", "int",
                                            "bundles kept in OUT_DIR/oom (default 20)"))
    #: One bundle over this is trimmed, largest optional files first.
    max_bundle_bytes: int = option(256 << 20, flag=Flag("--max-bundle-bytes", "int",
                                                        "one bundle is trimmed past this"))
    #: Retention of ``<out_dir>/oom`` by total size.
    max_total_bytes: int = option(1 << 30, flag=Flag("--max-total-bytes", "int",
                                                     "OUT_DIR/oom is kept under this"))
    #: Record the CUDA allocator's allocation history (costs a stack walk per allocation;
    #: makes ``snapshot.pickle`` show who allocated what).
    record_history: bool = option(False, v.flag, Flag("--record-history", "on",
                                                      "record the CUDA allocator's history"))
    #: SIGTERM/SIGUSR1 write a bundle, then go to the previous handler.
    signals: bool = option(True, v.flag, Flag("--no-signals", "off",
                                              "SIGTERM/SIGUSR1 write no bundle"))
    #: Each bundle's ``report.html``: ``"full"`` (charts; plotly.js inlined, about 5 MB),
    #: ``"tables"`` (a few KiB), ``"none"``, or ``"auto"`` (default: full, but tables for the
    #: bundles a distributed job's survivors write when the launcher stops them with a signal).
    #: ``memwatch report BUNDLE`` draws the charts later.
    bundle_report: str = option("auto", flag=Flag("--bundle-report", "str",
                                                  "each bundle's report.html: auto, full, "
                                                  "tables, none"))
    #: What a training session leaves in ``out_dir`` when it closes: ``report.html`` (the
    #: run's verdicts first, then its charts) and ``summary.json`` (the same for a machine; see
    #: ``docs/bundle-format.md``). ``"auto"`` (default): the charts (plotly.js inlined, about
    #: 5 MB) when drawing them keeps memwatch within its 1% budget of the run, the tables alone
    #: (a few KiB) otherwise; ``"full"``: always the charts; ``"tables"``; ``"none"``: neither
    #: file.
    run_report: str = option("auto", v.choice("auto", "full", "tables", "none"),
                         Flag("--report", "str", "OUT_DIR/report.html and summary.json at the "
                              "end: full (charts, the default of memwatch run), tables, auto "
                              "(charts when cheap), none"))
    #: ``True`` (defaults), ``False``, a dict or a :class:`memwatch.WatchdogConfig` (thresholds
    #: and actions).
    watchdog: Any = option(True, lambda name, value: parse_watchdog(value),
                           Flag("--no-watchdog", "off",
                                "no thresholds or forecasts acting before the crash"))
    #: Objects following :class:`memwatch.sinks.Sink` (W&B, Prometheus, JSONL...): they get the
    #: latest sample every ``log_every_n_steps`` steps, every check's report and every bundle
    #: written; one that fails is disabled after one warning. A
    #: :class:`memwatch.sinks.SinkSet` is shared as it is (its owner closes it).
    sinks: Sequence[Any] | SinkSet | None = option(None, v.sinks)
    #: How often the sinks get a sample (optimizer steps).
    log_every_n_steps: int = option(
        50, v.at_least(1, "(how often the sinks get a sample), e.g. 50."),
        Flag("--log-every-n-steps", "int", "how often sinks (W&B...) get a sample (default 50)"),
        adapter=False)
    #: Trace Python allocations (``True``: 8 frames each, or the number of frames) and diff
    #: them by allocation site at every check, so that a leak of plain Python objects (lists of
    #: dicts, string logs, caches of bytes or arrays) is named by the line that allocates it.
    #: Costs time on every Python allocation while on (see ``docs/benchmarks.md``); tracing the
    #: user already started is used and never stopped.
    tracemalloc: bool | int = option(
        False, v.tracing,
        Flag("--tracemalloc", "frames", "trace Python allocations (8 frames, or FRAMES) to name "
             "leaks of plain Python objects"))
    #: The loop this session watches: ``"train"`` (default), or ``"val"``, ``"test"``,
    #: ``"predict"`` for an evaluation session beside training (its findings say so; it sends
    #: no per-step samples to the sinks).
    stage: str = option("train", v.choice(*STAGES))
    #: A check (verdicts) inside the epoch every N optimizer steps (with
    #: ``check_every_s``: whichever comes first); ``None`` turns it off (both ``None``: checks
    #: at epoch ends only). Every epoch end is a check too. ``"auto"`` (default): checks sized
    #: to the run while its length is unknown: at steps 100, 200, 400 ... 3,200 (each interval
    #: twice the previous one, none before the process ran 0.1 s of CPU since the last one),
    #: then every 5,000 steps; once an epoch has ended, every 5,000 steps inside epochs
    #: (:mod:`memwatch.session.cadence`). A short run is judged, a long one pays for six more
    #: checks than every 5,000 steps would (a leak is confirmed at the second or third check
    #: after it starts): see ``docs/findings.md``. Only step-based checks exchange summaries
    #: across ranks (every rank reaches the same step; the clocks of ranks differ).
    check_every_n_steps: int | str | None = option(
        "auto", v.check_steps,
        Flag("--check-every-n-steps", "steps",
             "a check (verdicts) every N optimizer steps (>= 16); auto (default: 100, 200, "
             "400 ... then every 5000); none: off"))
    #: ... and every T seconds (``None``: not by time).
    check_every_s: float | None = option(
        600.0, v.optional(v.positive("for example 600 (seconds), or None")),
        Flag("--check-every-s", "float?",
             "... or every S seconds, whichever comes first (default 600; none: off)"))
    #: When the run's length is unknown, growth that would reach the limit within this much
    #: wall time is a ``warning`` (default: 3 days); slower growth is ``info``.
    horizon_s: float = option(
        3 * 86400.0, v.positive("for example 259200 (3 days, in seconds)"),
        Flag("--horizon-s", "float",
             "without --total-steps: growth reaching the limit within S seconds is a warning"))
    #: The epoch length, when known (the adapters set it): in the first epoch of a run planned
    #: to have more, checks inside it leave leak verdicts to its end (only an epoch end tells a
    #: leak from epoch-scoped accumulation).
    steps_per_epoch: int | None = option(
        None, v.optional(v.positive_int("or None when it is not known")),
        Flag("--steps-per-epoch", "int?", "the epoch length, when known"))
    #: A :class:`memwatch.MemWatchWarning` for each new finding of severity warning or critical
    #: that a check inside an epoch makes (``step()`` cannot return them; the findings of
    #: ``end_epoch()`` are returned). The adapters warn themselves.
    warn: bool = option(True, v.flag,
                        Flag("--warn", "on", "also raise a MemWatchWarning in the script per "
                             "verdict (watch()'s warn=True)"), adapter=False)
    #: How often the black box (``<out_dir>/blackbox/``: the record that survives SIGKILL and
    #: the kernel's OOM killer) is rewritten, seconds; ``None``: none.
    blackbox_every_s: float | None = option(
        5.0, v.optional(v.positive("for example 5 (seconds between rewrites of the black box), "
                                   "or None for none")),
        Flag("--blackbox-every-s", "float?",
             "how often the black box is rewritten (default 5; none: no black box)"))
    #: Who may read what memwatch writes under ``out_dir``: ``"private"`` (default:
    #: directories 0700, files 0600) or ``"group"`` (0750/0640: the directory's group may read
    #: bundles and records, never write them). See ``docs/security.md``.
    share: str = option("private", v.share)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check = spec(f).check
            if check is not None:
                object.__setattr__(self, f.name, check(f.name, getattr(self, f.name)))
        self.recorder_config  # noqa: B018 - validates the recorder's options together now

    @property
    def device_spec(self) -> Any:
        """``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a probe object."""
        return self.device

    @property
    def tracemalloc_frames(self) -> int:
        """Frames kept per traced allocation; 0 when tracing is off."""
        return v.tracemalloc_frames(self.tracemalloc)

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
    def check_cadence(self) -> int | None:
        """``check_every_n_steps`` as a number of steps (``"auto"``: the cap of the checks
        sized to the run, :data:`CHECK_CAP_STEPS`); ``None``: no step-based checks."""
        n = self.check_every_n_steps
        return CHECK_CAP_STEPS if n == "auto" else n  # type: ignore[return-value]

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


def flags() -> tuple[tuple[Flag, str], ...]:
    """``memwatch run``'s flags, each with the option it sets, in the options' order."""
    return tuple((fl, f.name) for f in dataclasses.fields(WatchConfig)
                 if (fl := spec(f).flag) is not None)
