"""Watchdog: thresholds with hysteresis, forecasts from findings, actions (alert, cleanup with
freed bytes, pre-OOM bundle, graceful stop), cadence, config errors, containment."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import memwatch
from memwatch.bundle import open_bundle
from memwatch.core.errors import ConfigError
from memwatch.core.findings import Finding
from memwatch.runtime.watchdog import Alert, WatchdogConfig
from memwatch.testing import FakeDevice

MIB = 1 << 20


def run_series(tmp_path: Path, series_mib: list[float], **cfg: Any
               ) -> tuple[list[Alert], memwatch.MemWatch, FakeDevice]:
    alerts: list[Alert] = []
    dev = FakeDevice(total_bytes=1000 * MIB)
    config = WatchdogConfig(**{"every_n_steps": 1, "alert": alerts.append, **cfg})
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp_path,
                        signals=False, watchdog=config, analyze=False) as mw:
        for v in series_mib:
            dev.set(allocated=int(v * MIB))
            mw.step()
    return alerts, mw, dev


def test_one_alert_per_crossing_with_hysteresis(tmp_path: Path) -> None:
    # Hovers around 85% (inside the 5% band): one warning. Falls to 70%, climbs again: a second.
    series = [500, 860, 840, 870, 830, 880, 700, 860, 870]
    alerts, _, _ = run_series(tmp_path, series)
    assert [(a.level, a.step) for a in alerts] == [("warning", 2), ("warning", 8)]
    a = alerts[0]
    assert a.scope == "device" and a.limit == 1000 * MIB
    assert a.utilization == pytest.approx(0.86)
    assert "86.0% of its limit" in a.message


def test_warning_then_critical_then_stop(tmp_path: Path) -> None:
    alerts, mw, _ = run_series(tmp_path, [900, 960, 950, 970],
                               on_critical=("alert", "stop"))
    assert [a.level for a in alerts] == ["warning", "critical"]
    assert mw.should_stop is True and "should_stop=True" in alerts[1].message


def test_critical_writes_a_pre_oom_bundle(tmp_path: Path) -> None:
    alerts, _, _ = run_series(tmp_path, [100, 990])
    (a,) = [a for a in alerts if a.level == "critical"]
    assert a.bundle is not None
    m = open_bundle(a.bundle).manifest
    assert m["trigger"] == "watchdog" and "critical" in m["reason"]
    assert "exception.json" not in m["files"]


def test_runs_only_every_n_steps(tmp_path: Path) -> None:
    alerts, _, _ = run_series(tmp_path, [100, 100, 900] + [900] * 10, every_n_steps=5)
    assert [(a.level, a.step) for a in alerts] == [("warning", 5)]


def test_cleanup_measures_freed_bytes_and_is_rate_limited(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=1000 * MIB)
    alerts: list[Alert] = []
    cfg = WatchdogConfig(every_n_steps=1, alert=alerts.append, on_warning=("alert", "cleanup"),
                         cleanup_min_interval_s=3600)
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp_path, signals=False,
                        watchdog=cfg, analyze=False) as mw:
        for h in [dev.malloc(30 * MIB) for _ in range(10)]:
            dev.free(h)  # 300 MiB freed to the cache: still reserved
        dev.set(allocated=880 * MIB)  # plus 880 MiB of live tensors: 88% of the device
        mw.step()  # crosses 85%: the cleanup releases the cached segments
        assert dev.reserved == 880 * MIB
        assert alerts[0].freed_bytes is not None
        assert alerts[0].freed_bytes["device.reserved"] == 300 * MIB
        assert "cleanup freed device.reserved 300.0 MiB" in alerts[0].message
        assert mw.watchdog is not None and mw.watchdog.cleanup() is None  # rate-limited
        forced = mw.watchdog.cleanup(force=True)
        assert forced is not None and forced["device.reserved"] == 0  # nothing left to free
        assert len(mw.watchdog.cleanups) == 2


def test_a_full_cache_alone_is_not_an_alert(tmp_path: Path) -> None:
    # Reserved at 99% but live tensors at 10%: the allocator would free its cache and retry.
    alerts: list[Alert] = []
    dev = FakeDevice(total_bytes=1000 * MIB)
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp_path, signals=False,
                        analyze=False, watchdog={"every_n_steps": 1, "alert": alerts.append}
                        ) as mw:
        dev.set(allocated=100 * MIB, reserved=990 * MIB)
        mw.step()
        assert alerts == []
    custom: list[Alert] = []
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=tmp_path, signals=False,
                        analyze=False, watchdog={"every_n_steps": 1, "alert": custom.append,
                                                 "metrics": ("device.reserved",)}) as mw:
        mw.step()
    assert [a.metric for a in custom] == ["device.reserved"]


def test_host_scope_uses_host_limit(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                        analyze=False, watchdog={"every_n_steps": 1}) as mw:
        mw.step()
        util = mw.watchdog.utilization()  # type: ignore[union-attr]
    assert "host" in util and 0 < util["host"][0] < 1


def test_forecast_alerts_once_per_finding_until_it_goes_away(tmp_path: Path) -> None:
    alerts: list[Alert] = []
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                        analyze=False, watchdog={"alert": alerts.append, "horizon_steps": 1000}
                        ) as mw:
        wd = mw.watchdog
        assert wd is not None
        leak = Finding(kind="leak", metric="host.rss", severity="warning",
                       message="host.rss grows by 1 MiB per step.", steps_to_oom=400.0)
        far = Finding(kind="leak", metric="device.allocated", severity="warning",
                      message="slow", steps_to_oom=1e6)
        near = Finding(kind="near_oom", metric="device.reserved", severity="critical",
                       message="peak at 97% of the device")
        wd.on_findings([leak, far])
        wd.on_findings([leak])  # still there: no second alert
        wd.on_findings([])  # gone
        wd.on_findings([leak, near])  # back, plus a near_oom
    assert [(a.level, a.metric) for a in alerts] == [
        ("forecast", "host.rss"), ("forecast", "host.rss"), ("forecast", "device.reserved")]
    assert "about 400 steps to OOM" in alerts[0].message
    assert alerts[0].finding is not None and alerts[0].finding["kind"] == "leak"


def test_end_epoch_feeds_findings_to_the_watchdog(tmp_path: Path) -> None:
    alerts: list[Alert] = []

    class ScriptedAnalyzer:
        def check(self, summary: object, context: object) -> list[Finding]:
            return [Finding(kind="near_oom", metric="device.peak", severity="critical",
                            message="peak close to the limit")]

    with memwatch.watch(device=FakeDevice(), host=False, workers=False, out_dir=tmp_path,
                        signals=False, analyze=False,
                        watchdog={"alert": alerts.append, "on_forecast": ("alert", "stop")}
                        ) as mw:
        mw.analyzer = ScriptedAnalyzer()
        mw.step()
        mw.end_epoch()
        assert mw.should_stop is True
    assert [a.level for a in alerts] == ["forecast"]


def test_broken_alert_callback_never_breaks_training(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def boom(alert: Alert) -> None:
        raise RuntimeError("pager is down")

    with caplog.at_level(logging.WARNING, logger="memwatch"):
        _, mw, _ = run_series(tmp_path, [900, 100, 900], alert=boom)
    assert mw.step_count == 3 and "watchdog" not in mw.disabled
    assert "alert callback failed" in caplog.text and caplog.text.count("memwatch watchdog") == 2


@pytest.mark.parametrize("bad", [
    {"warning": 0.9, "critical": 0.8},
    {"warning": 0},
    {"every_n_steps": 0},
    {"on_critical": ("alert", "reboot")},
    {"hysteresis": 0.9},
    {"alert": "not callable"},
    {"horizon_steps": -1},
    {"metrics": "device.reserved"},
    {"no_such_option": 1},
])
def test_config_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        memwatch.MemWatch(watchdog=bad)


def test_watchdog_off(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                        watchdog=False) as mw:
        mw.step()
        assert mw.watchdog is None
