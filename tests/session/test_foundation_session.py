"""MemWatch's lifecycle: sampling, the background thread, failures that must not reach training."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import memwatch
from memwatch import MemWatch
from memwatch.probes.base import DEVICE_FAST_KEYS
from memwatch.probes.malloc import MallocInfo
from memwatch.testing import FakeDevice

HOST_KEYS = {"host.rss", "host.uss", "host.pss", "host.swap", "host.rss_anon", "host.rss_file",
             "host.rss_shmem"}
if MallocInfo.open() is not None:  # glibc >= 2.33: the C allocator's in-use and free bytes
    HOST_KEYS |= {"host.malloc_in_use", "host.malloc_free"}


def _host_keys() -> set[str]:
    """This process's host keys here: the process's, plus its memory cgroup's and the machine's
    where Linux has them (memwatch.probes.cgroup)."""
    from memwatch.probes.cgroup import CgroupProbe

    p = CgroupProbe()
    try:
        return HOST_KEYS | set(p.slow_keys)
    finally:
        p.close()
WORKER_KEYS = {"workers.count", "workers.rss", "workers.uss", "workers.pss", "workers.max_uss"}


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "memwatch-sampler"]


def test_latest_keys_cpu_host_only(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path) as mw:
        assert mw.latest() == {}  # nothing sampled yet
        mw.step()
        latest = mw.latest()
    assert set(latest) == _host_keys()
    assert latest["host.rss"] > 0
    assert latest["host.uss"] > 0 and latest["host.pss"] > 0  # polled once at start()


def test_latest_keys_with_device_host_and_workers(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=2**30)
    with memwatch.watch(device=dev, out_dir=tmp_path) as mw:
        dev.set(allocated=5 * 2**20, reserved=8 * 2**20)
        mw.step()
        latest = mw.latest()
    assert set(latest) == set(DEVICE_FAST_KEYS) | {"device.free", "device.total"} | {
        # FakeDevice scripts both (0 unless a test sets them): memory outside the caching
        # allocator and CUDA graphs' private pools (memwatch.probes.base)
        "device.outside_allocator", "device.private_pools"} | _host_keys() | WORKER_KEYS
    assert latest["device.allocated"] == 5 * 2**20
    assert latest["device.reserved"] == 8 * 2**20
    assert latest["device.total"] == 2**30
    assert latest["workers.count"] == 0  # no DataLoader here
    assert all(isinstance(v, float) for v in latest.values())


def test_timeline_records_every_step(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=2**30)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path) as mw:
        for i in range(50):
            dev.set(allocated=i * 1000)
            mw.step()
        assert mw.step_count == 50
        assert mw.timeline is not None
        steps, values = mw.timeline.series("device.allocated")
        assert list(steps) == list(range(1, 51))
        assert list(values) == [i * 1000.0 for i in range(50)]
        summary_findings = mw.end_epoch()
        assert isinstance(summary_findings, list)
        assert mw.epoch == 1 and len(mw.epochs) == 1
        assert mw.epochs[0].n_steps == 50


def test_end_epoch_before_start_and_after_close_returns_empty(tmp_path: Path) -> None:
    mw = MemWatch(device="cpu", workers=False, out_dir=tmp_path)
    assert mw.end_epoch() == []
    mw.step()  # before start: a no-op, not an error
    assert mw.step_count == 0 and mw.latest() == {}
    mw.start()
    mw.step()
    mw.close()
    assert mw.end_epoch() == []
    mw.step()
    assert mw.step_count == 1


def test_end_epoch_with_no_step_is_empty(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path) as mw:
        assert mw.end_epoch() == []


def test_close_is_idempotent_and_start_twice_is_harmless(tmp_path: Path) -> None:
    dev = FakeDevice()
    mw = MemWatch(device=dev, workers=False, out_dir=tmp_path)
    assert mw.start() is mw
    assert mw.start() is mw  # second start: same session, no second sampler
    mw.close()
    mw.close()
    assert dev.closed and not mw.running


def test_sampler_thread_runs_during_watch_and_is_joined_by_close(tmp_path: Path) -> None:
    before = set(_sampler_threads())
    with memwatch.watch(device="cpu", workers=False, interval_s=0.02, out_dir=tmp_path) as mw:
        mine = [t for t in _sampler_threads() if t not in before]
        assert len(mine) == 1 and mine[0].is_alive() and mine[0].daemon
        assert mw._sampling.slow is not None
        passes = mw._sampling.slow.passes
        deadline = time.monotonic() + 5
        while mw._sampling.slow.passes < passes + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mw._sampling.slow.passes >= passes + 3, "the background sampler does not poll"
    assert not mine[0].is_alive(), "close() must stop and join the sampler thread"


def test_exception_in_the_with_block_still_closes(tmp_path: Path) -> None:
    before = set(_sampler_threads())
    with pytest.raises(KeyError):
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path) as mw:
            mine = [t for t in _sampler_threads() if t not in before]
            raise KeyError("boom")
    assert not mw.running and not mine[0].is_alive()


class _FlakyFast(FakeDevice):
    """A device whose per-step read starts failing after ``ok_reads`` calls."""

    def __init__(self, ok_reads: int) -> None:
        super().__init__(total_bytes=2**30)
        self.ok_reads = ok_reads
        self.reads = 0

    def read_fast(self) -> Sequence[float]:
        self.reads += 1
        if self.reads > self.ok_reads:
            raise OSError("device vanished")
        return super().read_fast()


class _FlakySlow(FakeDevice):
    def __init__(self) -> None:
        super().__init__(total_bytes=2**30)
        self.slow_calls = 0

    def read_slow(self) -> dict[str, float]:
        self.slow_calls += 1
        if self.slow_calls > 1:
            raise PermissionError("NVML says no")
        return super().read_slow()


def _memwatch_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "memwatch" and r.levelno == logging.WARNING]


def test_fast_probe_failure_disables_it_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev = _FlakyFast(ok_reads=5)
    caplog.set_level(logging.WARNING, logger="memwatch")
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path) as mw:
        for _ in range(20):
            mw.step()  # must never raise
        latest = mw.latest()
        assert mw.step_count == 20
        assert math.isnan(latest["device.allocated"]) and math.isnan(latest["device.ooms"])
        assert latest["host.rss"] > 0  # the other probes keep working
        _, alloc = mw.timeline.series("device.allocated")  # type: ignore[union-attr]
        assert not any(math.isnan(v) for v in alloc[:5])
        assert all(math.isnan(v) for v in alloc[5:])
        assert "probe device" in mw.disabled
        mw.end_epoch()
    warnings = _memwatch_warnings(caplog)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "device vanished" in warnings[0].getMessage()
    assert "disabled" in warnings[0].getMessage()


def test_slow_probe_failure_disables_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev = _FlakySlow()
    caplog.set_level(logging.WARNING, logger="memwatch")
    # Passes counted, not waited for: the background thread's period is an hour (it never
    # runs here) and each pass is the reader's poll(), the call that thread makes. A wait of a
    # few seconds for a background pass failed on a loaded machine.
    with memwatch.watch(device=dev, workers=False, interval_s=3600, out_dir=tmp_path) as mw:
        mw.step()  # the unit's first step reads the slow probes: the first call succeeds
        assert dev.slow_calls == 1 and "probe device" not in mw.disabled
        mw._sampling.slow.poll()  # a background pass: the probe fails, is disabled
        assert "probe device" in mw.disabled
        for _ in range(3):
            mw._sampling.slow.poll()  # more background passes: none may warn again
        mw.step()
        latest = mw.latest()
        mw.end_epoch()  # polls the slow probes again, on the training thread
        mw.step()
    assert math.isnan(latest["device.free"]) and math.isnan(latest["device.total"])
    assert latest["device.allocated"] == 0.0  # the fast half of the same probe still works
    warnings = _memwatch_warnings(caplog)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "NVML says no" in warnings[0].getMessage()
    assert dev.slow_calls == 2  # disabled after the first failure, never called again


def test_a_read_returning_the_wrong_width_is_a_failure_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Short(FakeDevice):
        def read_fast(self) -> Sequence[float]:
            return (1.0,)

    caplog.set_level(logging.WARNING, logger="memwatch")
    with memwatch.watch(device=Short(), workers=False, out_dir=tmp_path) as mw:
        mw.step()
        mw.step()
        assert mw.step_count == 2
        assert math.isnan(mw.latest()["device.reserved"])
    assert len(_memwatch_warnings(caplog)) == 1


class _OverlapDetector(FakeDevice):
    """Notices two slow reads at once (the background pass and an epoch end's refresh)."""

    def __init__(self) -> None:
        super().__init__(total_bytes=2**30)
        self.inside = 0
        self.overlaps = 0
        self.calls = 0

    def read_slow(self) -> dict[str, float]:
        self.inside += 1
        self.calls += 1
        try:
            if self.inside > 1:
                self.overlaps += 1
            time.sleep(0.003)  # a slow read: smaps_rollup of big workers, NVML
            return super().read_slow()
        finally:
            self.inside -= 1


def test_epoch_end_refresh_never_overlaps_a_background_pass(tmp_path: Path) -> None:
    # Probes keep per-pass state (the workers probe renumbers workers), so two passes at once
    # could corrupt it and get a healthy probe disabled.
    dev = _OverlapDetector()
    with memwatch.watch(device=dev, workers=False, interval_s=0.001, out_dir=tmp_path) as mw:
        for _ in range(40):
            mw.step()
            mw.end_epoch()
    assert dev.calls > 40
    assert dev.overlaps == 0


@pytest.mark.skipif(MallocInfo.open() is None, reason="glibc without mallinfo2 (musl, macOS)")
def test_in_use_bytes_of_a_background_pass_are_read_again_at_the_step(tmp_path: Path) -> None:
    # A background pass runs at any moment of a step, when in-use bytes also hold the step's
    # temporaries; the timeline must get what the loop keeps at the step's sample (read again
    # there), not the pass's moment. A pass's reading is planted far above anything real (no
    # real pass runs in the test: its period is ten minutes).
    with memwatch.watch(device="cpu", workers=False, interval_s=600, out_dir=tmp_path) as mw:
        mw.step()
        slow = mw._sampling.slow
        assert slow is not None
        keys = list(slow.keys)
        i_use, i_free = keys.index("host.malloc_in_use"), keys.index("host.malloc_free")
        planted = list(slow.values)
        planted[i_use] = planted[i_free] = 2.0 ** 50  # 1 PiB: what no step's sample can read
        i_rss_anon = keys.index("host.rss_anon")
        planted[i_rss_anon] = 123.0  # any other slow value is the pass's own
        slow.values = planted  # what a pass publishes: a new list
        mw.step()
        latest = mw.latest()
        assert latest["host.rss_anon"] == 123.0
        assert 0 < latest["host.malloc_in_use"] < 2.0 ** 40
        assert 0 <= latest["host.malloc_free"] < 2.0 ** 40
        mw.step()  # the same pass: not read again, the step's reading repeats
        assert mw.latest()["host.malloc_in_use"] == latest["host.malloc_in_use"]
