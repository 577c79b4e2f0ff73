"""The watchdog: act before the crash when memwatch can see it coming.

Two kinds of trigger:

* **utilization** of a known limit (device total, cgroup/physical host memory), per scope
  (``device``, ``host``): ``warning`` and ``critical`` thresholds with hysteresis, so a run
  hovering at the threshold gets one alert per crossing, not one per sample. The host scope
  counts ``host.rss`` less its file-backed pages (``host.rss_file``, where Linux reports it):
  pages of mapped files are page cache the kernel reclaims before it kills anything, and a
  mapped dataset may fill RSS up to the machine's memory in a healthy run;
* **forecast**: an analyzer finding of kind ``near_oom``, or any finding whose ``steps_to_oom``
  is below ``horizon_steps`` (one alert per finding kind and metric until it goes away).

Actions, per trigger level: ``"alert"`` (the ``alert`` callback, or a log warning),
``"cleanup"`` (``gc.collect()`` + ``empty_cache()`` on the training thread at a step boundary,
rate-limited, the bytes it freed measured), ``"bundle"`` (a pre-OOM bundle through the flight
recorder) and ``"stop"`` (sets ``MemWatch.should_stop``; integrations map it to
``trainer.should_stop`` / ``control.should_training_stop``; a plain loop checks it).

It runs from ``MemWatch.step()`` every ``every_n_steps`` steps (the per-step cost is one integer
comparison) and from ``end_epoch()`` with the new findings.

Example::

    >>> import memwatch
    >>> from memwatch.testing import FakeDevice
    >>> from memwatch.runtime.watchdog import WatchdogConfig
    >>> alerts = []
    >>> dev = FakeDevice(total_bytes=1000 * 2**20)
    >>> cfg = WatchdogConfig(every_n_steps=1, alert=alerts.append, on_critical=("alert", "stop"))
    >>> with memwatch.watch(device=dev, host=False, workers=False, out_dir=str(tmp),
    ...                     watchdog=cfg) as mw:
    ...     for mib in (100, 900, 910, 960, 970):
    ...         dev.set(allocated=mib * 2**20)
    ...         mw.step()
    >>> [a.level for a in alerts], mw.should_stop
    (['warning', 'critical'], True)
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from memwatch.core.errors import ConfigError
from memwatch.core.findings import Finding
from memwatch.core.protocols import SessionView
from memwatch.core.units import fmt_bytes
from memwatch.probes.procfs import rss_now

__all__ = ["ACTIONS", "DEFAULT_METRICS", "Alert", "Watchdog", "WatchdogConfig", "file_pages",
           "holders", "parse_watchdog"]

log = logging.getLogger("memwatch")

ACTIONS: frozenset[str] = frozenset({"alert", "cleanup", "bundle", "stop"})
#: Metrics compared with their limits by default. Not ``device.reserved``: the caching allocator
#: frees its cache and retries before it raises an OOM, so a full cache is not a risk by itself
#: (and healthy runs often keep it near the device total).
#: ``cgroup.working_set`` is the job's memory as the kernel's OOM killer counts it (main process,
#: workers and everything else in the memory cgroup, less reclaimable page cache).
DEFAULT_METRICS: tuple[str, ...] = ("device.allocated", "device.peak", "host.rss",
                                    "cgroup.working_set")
_LEVELS = {"ok": 0, "warning": 1, "critical": 2}
_LIMITS_REFRESH_S = 60.0


@dataclasses.dataclass(frozen=True)
class WatchdogConfig:
    """Watchdog thresholds and actions (``MemWatch(watchdog=WatchdogConfig(...))`` or a dict).

    Args:
        every_n_steps: how often ``step()`` runs the threshold check.
        warning, critical: utilization (0-1] of a known limit that raises each level.
        hysteresis: a level re-arms only once utilization falls this far below its threshold.
        horizon_steps: forecast alerts for findings with fewer ``steps_to_oom`` than this.
        on_warning, on_critical, on_forecast: actions among ``alert``, ``cleanup``, ``bundle``,
            ``stop``.
        alert: callback receiving each :class:`Alert` (default: a ``memwatch`` log warning).
        cleanup_min_interval_s: at most one cleanup per this many seconds (``gc.collect`` on a
            big heap costs real time).
        metrics: the metrics compared with their known limits (the fullest one per scope counts).
    """

    enabled: bool = True
    every_n_steps: int = 50
    warning: float = 0.85
    critical: float = 0.95
    hysteresis: float = 0.05
    horizon_steps: float = 2000.0
    on_warning: tuple[str, ...] = ("alert",)
    on_critical: tuple[str, ...] = ("alert", "bundle")
    on_forecast: tuple[str, ...] = ("alert",)
    alert: Callable[[Alert], Any] | None = None
    cleanup_min_interval_s: float = 60.0
    metrics: tuple[str, ...] = DEFAULT_METRICS

    def __post_init__(self) -> None:
        n = self.every_n_steps
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"watchdog every_n_steps={n!r} must be an int >= 1, e.g. 50.")
        for name in ("warning", "critical"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v <= 1.5:
                raise ConfigError(f"watchdog {name}={v!r} must be a fraction of the limit in "
                                  "(0, 1.5], e.g. 0.85.")
        if self.warning > self.critical:
            raise ConfigError(f"watchdog warning={self.warning} is above critical="
                              f"{self.critical}; warning must be the lower threshold.")
        h = self.hysteresis
        if not isinstance(h, (int, float)) or not 0 <= h < self.warning:
            raise ConfigError(f"watchdog hysteresis={h!r} must be >= 0 and below warning, "
                              "e.g. 0.05.")
        hz = self.horizon_steps
        if not isinstance(hz, (int, float)) or not hz > 0 or math.isnan(hz):
            raise ConfigError(f"watchdog horizon_steps={hz!r} must be a positive number.")
        for name in ("on_warning", "on_critical", "on_forecast"):
            acts = getattr(self, name)
            if isinstance(acts, str):
                acts = (acts,)
                object.__setattr__(self, name, acts)
            if not isinstance(acts, (tuple, list)):
                raise ConfigError(f"watchdog {name}={acts!r}: use an action or a tuple of "
                                  f"actions from {sorted(ACTIONS)}, or () for none.")
            bad = [a for a in acts if a not in ACTIONS]
            if bad:
                raise ConfigError(f"watchdog {name}={acts!r}: unknown action(s) {bad}; use "
                                  f"{sorted(ACTIONS)}.")
        if self.alert is not None and not callable(self.alert):
            raise ConfigError(f"watchdog alert={self.alert!r} must be a callable taking an Alert.")
        if isinstance(self.metrics, str) or not all(isinstance(m, str) for m in self.metrics):
            raise ConfigError(f"watchdog metrics={self.metrics!r} must be a tuple of metric names, "
                              f"e.g. {DEFAULT_METRICS}.")
        object.__setattr__(self, "metrics", tuple(self.metrics))
        c = self.cleanup_min_interval_s
        if not isinstance(c, (int, float)) or c < 0:
            raise ConfigError(f"watchdog cleanup_min_interval_s={c!r} must be >= 0 seconds.")


def holders(latest: Mapping[str, float], total: float) -> str:
    """Who holds a memory cgroup's working set: this process, its DataLoader workers, the rest
    (page cache not yet reclaimed, shared pages, other processes of the job), largest named.

    >>> holders({"host.rss": 600.0, "workers.uss": 300.0, "workers.count": 2.0}, 1000.0
    ...         ).split("; ")[-1]
    'largest: the training process'
    """
    parts: list[tuple[str, float]] = []
    rss = latest.get("host.rss")
    if rss is not None and math.isfinite(rss):
        parts.append(("the training process (RSS)", rss))
    wu = latest.get("workers.uss")
    if wu is not None and math.isfinite(wu):
        n = latest.get("workers.count")
        count = f"{n:.0f} " if n is not None and math.isfinite(n) else ""
        parts.append((f"{count}DataLoader workers (USS)", wu))
    rest = total - sum(v for _, v in parts)
    parts.append(("the rest", max(0.0, rest)))
    largest = max(parts, key=lambda kv: kv[1])[0].split(" (")[0]
    return ("held by: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in parts)
            + f"; largest: {largest}")


def file_pages(latest: Mapping[str, float]) -> float:
    """The file-backed resident bytes the host scope leaves out of ``host.rss`` (0 when
    unknown): mapped files' pages, which the kernel reclaims under pressure.

    >>> file_pages({"host.rss": 900.0, "host.rss_file": 600.0}), file_pages({"host.rss": 9.0})
    (600.0, 0.0)
    """
    f = latest.get("host.rss_file")
    rss = latest.get("host.rss")
    if f is None or rss is None or not math.isfinite(f) or not math.isfinite(rss) or f <= 0:
        return 0.0
    return min(float(f), float(rss))  # the split is a background read: never below zero


def parse_watchdog(value: Any) -> WatchdogConfig | None:
    """``True`` (defaults), ``False``/``None`` (off), a :class:`WatchdogConfig` or a dict."""
    if value is True:
        return WatchdogConfig()
    if value is False or value is None:
        return None
    if isinstance(value, WatchdogConfig):
        return value if value.enabled else None
    if isinstance(value, Mapping):
        try:
            cfg = WatchdogConfig(**value)
        except TypeError as e:
            names = sorted(f.name for f in dataclasses.fields(WatchdogConfig))
            raise ConfigError(f"watchdog={dict(value)!r}: {e}; known options: {names}.") from None
        return cfg if cfg.enabled else None
    raise ConfigError(f"watchdog={value!r}: use True, False, a dict or a WatchdogConfig.")


@dataclasses.dataclass
class Alert:
    """One watchdog event, with what the watchdog did about it.

    Example::

        >>> from memwatch.runtime.watchdog import Alert
        >>> a = Alert("warning", "device", "device.allocated", "device memory at 90%", step=7,
        ...           value=900.0, limit=1000.0, utilization=0.9)
        >>> a.to_dict()["utilization"]
        0.9
    """

    level: str  # "warning" | "critical" | "forecast"
    scope: str  # "device" | "host" | the finding's metric
    metric: str
    message: str
    step: int
    LEVELS: ClassVar[tuple[str, ...]] = ("warning", "critical", "forecast")
    #: The reading that crossed a threshold, its limit, and their ratio (threshold alerts).
    value: float | None = None
    limit: float | None = None
    utilization: float | None = None
    #: The finding a forecast alert is about.
    finding: dict[str, Any] | None = None
    #: What the watchdog did: its actions, the bytes a cleanup freed, the bundle it wrote.
    actions: list[str] = dataclasses.field(default_factory=list)
    freed_bytes: dict[str, float] | None = None
    bundle: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["bundle"] = str(self.bundle) if self.bundle else None
        return d


class Watchdog:
    """Checks thresholds and forecasts for one session and runs the configured actions.

    Args:
        config: thresholds and actions.
        view: the session's read-only view (latest sample, limits, step, device).
        dump: writes a bundle for the ``"bundle"`` action (the flight recorder's); returns its
            path or None.
        stop: asks the run to stop gracefully, with the reason (the ``"stop"`` action).
    """

    def __init__(self, config: WatchdogConfig, view: SessionView, *,
                 dump: Callable[[str], Path | None] | None = None,
                 stop: Callable[[str], None] | None = None) -> None:
        self.view = view
        self.config = config
        self._dump = dump
        self._stop = stop
        self.alerts: collections.deque[Alert] = collections.deque(maxlen=256)
        self.cleanups: list[dict[str, float]] = []
        self._state: dict[str, int] = {}
        self._forecast_active: set[tuple[str, str]] = set()
        self._limits: dict[str, float] = {}
        self._limits_at = -math.inf
        self._last_cleanup = -math.inf
        self._callback_failed = False

    # ------------------------------------------------------------------ thresholds
    def _current_limits(self) -> dict[str, float]:
        now = time.monotonic()
        if now - self._limits_at > _LIMITS_REFRESH_S:
            self._limits = self.view.limits()
            self._limits_at = now
        return self._limits

    def utilization(self) -> dict[str, tuple[float, str, float, float]]:
        """Per scope: (utilization, metric, value, limit) of the fullest metric with a limit."""
        latest = self.view.latest()
        out: dict[str, tuple[float, str, float, float]] = {}
        for metric, limit in self._current_limits().items():
            if metric not in self.config.metrics:
                continue
            v = latest.get(metric)
            if v is None or not limit or limit <= 0 or math.isnan(v):
                continue
            if metric == "host.rss":
                v -= file_pages(latest)
            scope = metric.split(".", 1)[0]
            u = v / limit
            if scope not in out or u > out[scope][0]:
                out[scope] = (u, metric, v, limit)
        return out

    def check(self) -> list[Alert]:
        """Compare utilization with the thresholds; fire one alert per upward crossing."""
        cfg = self.config
        fired: list[Alert] = []
        for scope, (u, metric, value, limit) in self.utilization().items():
            state = self._state.get(scope, 0)
            # Hysteresis: a level holds while utilization stays within `hysteresis` below its
            # threshold, so noise around a threshold cannot fire a second alert.
            if u >= cfg.critical or (state == 2 and u >= cfg.critical - cfg.hysteresis):
                new = 2
            elif u >= cfg.warning or (state >= 1 and u >= cfg.warning - cfg.hysteresis):
                new = 1
            else:
                new = 0
            if new > state:
                level = "critical" if new == 2 else "warning"
                msg = (f"{scope} memory at {u * 100:.1f}% of its limit ({metric} "
                       f"{fmt_bytes(value)} of {fmt_bytes(limit)}; {level} threshold "
                       f"{(cfg.critical if new == 2 else cfg.warning) * 100:.0f}%)")
                if scope == "cgroup":
                    msg += "; " + holders(self.view.latest(), value)
                if metric == "host.rss" and file_pages(self.view.latest()) > 0:
                    msg += (f"; {fmt_bytes(file_pages(self.view.latest()))} of file-backed "
                            "pages (mapped files, reclaimable) not counted")
                alert = Alert(level, scope, metric, msg, self.view.step_count, value, limit, u)
                reason = (f"{scope} memory at {u * 100:.0f}% of its limit ({level} threshold "
                          f"{(cfg.critical if new == 2 else cfg.warning) * 100:.0f}%)")
                self._act(alert, cfg.on_critical if new == 2 else cfg.on_warning, reason)
                fired.append(alert)
            self._state[scope] = new
        return fired

    # ------------------------------------------------------------------ forecasts
    def on_findings(self, findings: Iterable[Finding]) -> list[Alert]:
        """Forecast alerts from the findings of one epoch end."""
        cfg = self.config
        fired: list[Alert] = []
        current: set[tuple[str, str]] = set()
        for f in findings:
            steps = f.steps_to_oom
            imminent = f.kind == "near_oom" or (
                steps is not None and math.isfinite(steps) and steps < cfg.horizon_steps)
            if not imminent:
                continue
            key = (f.kind, f.metric)
            current.add(key)
            if key in self._forecast_active:
                continue
            eta = f" (about {steps:.0f} steps to OOM)" if steps is not None else ""
            alert = Alert("forecast", f.metric.split(".", 1)[0], f.metric,
                          f"{f.kind} on {f.metric}{eta}: {f.message}", self.view.step_count,
                          finding=f.to_dict())
            if f.kind == "near_oom":
                reason = f"{f.metric} peaked near its limit (near_oom)"
            else:
                reason = f"out of memory is forecast: {f.kind} on {f.metric}{eta}"
            self._act(alert, cfg.on_forecast, reason)
            fired.append(alert)
        self._forecast_active = current
        return fired

    # ------------------------------------------------------------------ actions
    def _act(self, alert: Alert, actions: tuple[str, ...], reason: str) -> None:
        alert.actions = list(actions)
        if "cleanup" in actions:
            alert.freed_bytes = self.cleanup()
            if alert.freed_bytes is not None:
                alert.message += "; cleanup freed " + ", ".join(
                    f"{k} {fmt_bytes(v)}" for k, v in alert.freed_bytes.items())
        if "bundle" in actions and self._dump is not None:
            alert.bundle = self._dump(f"watchdog {alert.level}: {alert.message}")
        if "stop" in actions and self._stop is not None:
            self._stop(reason)
            alert.message += "; asked the run to stop gracefully (should_stop=True)"
        self.alerts.append(alert)
        if "alert" in actions:
            self._notify(alert)

    def _notify(self, alert: Alert) -> None:
        cb = self.config.alert
        if cb is None:
            log.warning("memwatch watchdog [%s]: %s", alert.level, alert.message)
            return
        try:
            cb(alert)
        except Exception as e:  # noqa: BLE001 - a broken callback must not break training
            if not self._callback_failed:
                self._callback_failed = True
                log.warning("memwatch: watchdog alert callback failed (%s: %s); falling back to "
                            "log warnings", type(e).__name__, e)
            log.warning("memwatch watchdog [%s]: %s", alert.level, alert.message)

    def _readings(self) -> dict[str, float]:
        out: dict[str, float] = {}
        dev = self.view.device
        if dev is not None:
            vals = dict(zip(dev.fast_keys, dev.read_fast(), strict=False))
            if "device.reserved" in vals:
                out["device.reserved"] = float(vals["device.reserved"])
        rss = rss_now()
        if rss is not None:
            out["host.rss"] = float(rss)
        return out

    def cleanup(self, force: bool = False) -> dict[str, float] | None:
        """``gc.collect()`` + ``empty_cache()``; returns bytes freed per metric (None when
        rate-limited). Call on the training thread, at a step boundary."""
        now = time.monotonic()
        if not force and now - self._last_cleanup < self.config.cleanup_min_interval_s:
            return None
        self._last_cleanup = now
        before = self._readings()
        t0 = time.perf_counter()
        gc.collect()
        dev = self.view.device
        if dev is not None:
            dev.empty_cache()
        after = self._readings()
        freed = {k: before[k] - after[k] for k in before if k in after}
        self.cleanups.append({**freed, "seconds": time.perf_counter() - t0})
        log.info("memwatch: cleanup freed %s", ", ".join(
            f"{k} {fmt_bytes(v)}" for k, v in freed.items()) or "nothing measurable")
        return freed
