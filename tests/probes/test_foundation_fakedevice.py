"""memwatch.testing.FakeDevice: the simulated caching allocator and the device-probe protocol."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import memwatch
from memwatch.probes.base import DEVICE_FAST_KEYS, DeviceProbe
from memwatch.testing import FakeDevice

MiB = 2**20
KiB = 2**10


def _fast(dev: FakeDevice) -> dict[str, float]:
    return dict(zip(dev.fast_keys, dev.read_fast(), strict=True))


def test_implements_the_device_probe_protocol() -> None:
    dev = FakeDevice()
    assert isinstance(dev, DeviceProbe)
    assert dev.fast_keys == DEVICE_FAST_KEYS
    assert len(dev.read_fast()) == len(dev.fast_keys)
    assert set(dev.read_slow()) <= set(dev.slow_keys)


@pytest.mark.parametrize(
    ("request_bytes", "block"), [(1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024)]
)
def test_requests_round_up_to_512_bytes(request_bytes: int, block: int) -> None:
    dev = FakeDevice()
    dev.malloc(request_bytes)
    assert dev.allocated == block


def test_small_requests_share_a_2mib_segment() -> None:
    dev = FakeDevice()
    handles = [dev.malloc(100 * KiB) for _ in range(11)]
    assert dev.reserved == 2 * MiB  # 11 x 100 KiB fit in one small segment
    assert dev.allocated == 11 * 100 * KiB
    assert len(dev.snapshot()["segments"]) == 1
    assert dev.snapshot()["segments"][0]["segment_type"] == "small"
    dev.malloc(1 * MiB)  # exactly 1 MiB is still "small"; 948 KiB are left: a second segment
    assert dev.reserved == 4 * MiB
    for h in handles:
        dev.free(h)


@pytest.mark.parametrize("size_mib", [1.5, 3, 9.9])
def test_requests_of_1_to_10_mib_get_a_20mib_segment(size_mib: float) -> None:
    dev = FakeDevice()
    dev.malloc(int(size_mib * MiB))
    assert dev.reserved == 20 * MiB
    assert dev.snapshot()["segments"][0]["segment_type"] == "large"


def test_requests_from_10_mib_get_their_own_segment_rounded_to_2mib() -> None:
    dev = FakeDevice()
    dev.malloc(11 * MiB)
    assert dev.reserved == 12 * MiB
    dev.malloc(10 * MiB)
    assert dev.reserved == 22 * MiB


def test_large_segment_is_split_and_reused() -> None:
    dev = FakeDevice()
    dev.malloc(3 * MiB)
    dev.malloc(12 * MiB)  # fits in the remaining 17 MiB of the same 20 MiB segment
    assert dev.reserved == 20 * MiB
    assert dev.allocated == 15 * MiB
    (seg,) = dev.snapshot()["segments"]
    assert [b["size"] for b in seg["blocks"]] == [3 * MiB, 12 * MiB, 5 * MiB]
    assert [b["state"] for b in seg["blocks"]] == ["active_allocated", "active_allocated",
                                                   "inactive"]


def test_free_keeps_the_cache_and_coalesces_neighbours() -> None:
    dev = FakeDevice()
    a = dev.malloc(256 * KiB)
    b = dev.malloc(256 * KiB)
    c = dev.malloc(256 * KiB)
    dev.free(b)
    (seg,) = dev.snapshot()["segments"]
    assert [blk["size"] for blk in seg["blocks"]] == [256 * KiB] * 3 + [2 * MiB - 768 * KiB]
    # A hole between two live blocks plus the tail: both count as inactive split memory.
    assert dev.inactive_split == 2 * MiB - 512 * KiB
    dev.free(a)  # merges with the hole after it
    (seg,) = dev.snapshot()["segments"]
    assert [blk["size"] for blk in seg["blocks"]] == [512 * KiB, 256 * KiB, 2 * MiB - 768 * KiB]
    dev.free(c)  # merges with both neighbours: one free block, the whole segment
    (seg,) = dev.snapshot()["segments"]
    assert [blk["size"] for blk in seg["blocks"]] == [2 * MiB]
    assert dev.allocated == 0 and dev.reserved == 2 * MiB  # cached, not released
    assert dev.inactive_split == 0  # a wholly free segment is not "split"


def test_best_fit_reuses_the_smallest_hole() -> None:
    dev = FakeDevice()
    hs = [dev.malloc(s * KiB) for s in (512, 64, 128, 64)]
    dev.free(hs[0])  # 512 KiB hole
    dev.free(hs[2])  # 128 KiB hole
    dev.malloc(100 * KiB)  # goes to the 128 KiB hole, not the 512 KiB one
    (seg,) = dev.snapshot()["segments"]
    states = [(blk["size"] // KiB, blk["state"]) for blk in seg["blocks"]]
    assert states[:5] == [(512, "inactive"), (64, "active_allocated"), (100, "active_allocated"),
                          (28, "inactive"), (64, "active_allocated")]


def test_empty_cache_releases_only_wholly_free_segments() -> None:
    dev = FakeDevice()
    keep = dev.malloc(3 * MiB)
    drop = dev.malloc(18 * MiB)  # does not fit the 17 MiB left in keep's segment
    small = dev.malloc(1000)
    dev.free(drop)
    dev.free(small)
    assert dev.reserved == 20 * MiB + 18 * MiB + 2 * MiB
    dev.empty_cache()
    assert dev.reserved == 20 * MiB
    dev.free(keep)
    dev.empty_cache()
    assert dev.reserved == 0 and dev.allocated == 0


def test_scripted_counters_add_to_the_simulation() -> None:
    dev = FakeDevice()
    dev.set(allocated=100 * MiB, reserved=150 * MiB, active=120 * MiB)
    dev.malloc(3 * MiB)
    f = _fast(dev)
    assert f["device.allocated"] == 103 * MiB
    assert f["device.reserved"] == 170 * MiB
    assert f["device.active"] == 123 * MiB
    dev.set(allocated=10, reserved=5)  # reserved below allocated is clamped up
    assert dev.reserved == 10 + 20 * MiB


def test_retry_after_releasing_the_cache_then_succeed() -> None:
    dev = FakeDevice(total_bytes=40 * MiB)
    dev.free(dev.malloc(3 * MiB))  # leaves a cached 20 MiB segment
    dev.malloc(30 * MiB)  # 20 + 30 > 40: release the cache, retry, fits
    assert dev.alloc_retries == 1 and dev.ooms == 0
    assert dev.reserved == 30 * MiB
    assert _fast(dev)["device.alloc_retries"] == 1


def test_oom_calls_observers_before_raising_torch_oom() -> None:
    torch = pytest.importorskip("torch")
    dev = FakeDevice(total_bytes=40 * MiB)
    dev.malloc(30 * MiB)
    seen: list[dict[str, object]] = []

    def observer(device: int, requested: int, total: int, free: int) -> None:
        # Runs while the failing call is still on the stack: nothing has unwound yet.
        frames = []
        f = sys._getframe()
        while f is not None:
            frames.append(f.f_code.co_name)
            f = f.f_back  # type: ignore[assignment]
        seen.append({"args": (device, requested, total, free), "frames": frames,
                     "allocated": dev.allocated, "ooms": dev.ooms,
                     "segments": len(dev.snapshot()["segments"])})

    assert dev.attach_oom_observer(observer) is True

    def train_step() -> None:
        dev.malloc(20 * MiB)

    with pytest.raises(torch.OutOfMemoryError) as info:
        train_step()
    assert isinstance(info.value, RuntimeError)  # what `except RuntimeError` code expects
    (event,) = seen
    assert event["args"] == (0, 20 * MiB, 40 * MiB, 10 * MiB)
    assert "train_step" in event["frames"]  # type: ignore[operator]
    assert event["allocated"] == 30 * MiB and event["ooms"] == 1 and event["segments"] == 1
    assert dev.alloc_retries == 1  # it did try releasing the cache first
    msg = str(info.value)
    assert msg.startswith("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
                          "capacity of 40.00 MiB of which 10.00 MiB is free.")
    assert "30.00 MiB is allocated by PyTorch" in msg
    assert "expandable_segments" in msg
    f = _fast(dev)
    assert f["device.ooms"] == 1 and f["device.allocated"] == 30 * MiB
    dev.detach_oom_observer()
    with pytest.raises(torch.OutOfMemoryError):
        dev.malloc(20 * MiB)
    assert len(seen) == 1 and dev.ooms == 2


def test_oom_without_torch_raises_the_memwatch_error(run_python) -> None:  # type: ignore[no-untyped-def]
    proc = run_python(
        """
        from memwatch.core.errors import FakeOutOfMemoryError, MemwatchError
        from memwatch.testing import FakeDevice
        dev = FakeDevice(total_bytes=8 * 2**20)
        calls = []
        dev.attach_oom_observer(lambda *a: calls.append(a))
        try:
            dev.malloc(9 * 2**20)
        except FakeOutOfMemoryError as e:
            assert isinstance(e, MemwatchError) and isinstance(e, RuntimeError)
            assert str(e).startswith("CUDA out of memory. Tried to allocate 9.00 MiB"), str(e)
        else:
            raise AssertionError("no OOM")
        assert calls == [(0, 9 * 2**20, 8 * 2**20, 8 * 2**20)], calls
        print("ok")
        """,
        block_torch=True,
    )
    assert proc.stdout.strip() == "ok"


def test_window_peak_sees_a_spike_between_steps_without_resetting_the_allocator() -> None:
    dev = FakeDevice()
    dev.set(allocated=100 * MiB)
    assert _fast(dev)["device.peak"] == 100 * MiB
    h = dev.malloc(50 * MiB)  # a transient spike between two steps
    dev.free(h)
    assert _fast(dev)["device.peak"] == 150 * MiB
    # The next window has no spike: its peak is the current allocation, not the old mark...
    dev.set(allocated=80 * MiB)
    assert _fast(dev)["device.peak"] == 80 * MiB
    # ...and memwatch never touched the allocator's own high-water mark.
    assert dev.max_allocated == 150 * MiB
    for _ in range(5):
        dev.read_fast()
    assert dev.max_allocated == 150 * MiB


def test_window_peak_survives_a_reset_by_someone_else() -> None:
    dev = FakeDevice()
    dev.set(allocated=100 * MiB)
    dev.free(dev.malloc(50 * MiB))
    assert _fast(dev)["device.peak"] == 150 * MiB
    dev.set(allocated=60 * MiB)
    dev.reset_peak()  # e.g. transformers' memory tracker calls reset_peak_memory_stats()
    assert dev.max_allocated == 60 * MiB
    assert _fast(dev)["device.peak"] == 60 * MiB  # the mark moved down: not a phantom spike
    dev.free(dev.malloc(30 * MiB))  # a spike below the old 150 MiB mark is still seen
    assert _fast(dev)["device.peak"] == 90 * MiB
    assert _fast(dev)["device.peak"] == 60 * MiB


def test_session_reads_the_fake_every_step(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=64 * MiB)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path) as mw:
        handles = []
        for _ in range(3):
            handles.append(dev.malloc(3 * MiB))
            mw.step()
        latest = mw.latest()
        assert mw.limits()["device.allocated"] == 64 * MiB
    assert latest["device.allocated"] == 9 * MiB
    assert latest["device.reserved"] == 20 * MiB
    # Slow read: taken at the first step (a unit's slow readings start there, after what the
    # step allocated: 20 MiB reserved for the first 3 MiB), not at every step.
    assert latest["device.free"] == 64 * MiB - 20 * MiB
    assert dev.closed
    assert dev.memory_stats()["allocation.all.current"] == 3
    assert dev.describe()["total_bytes"] == 64 * MiB


def test_a_large_remainder_of_1_mib_or_less_is_not_split() -> None:
    dev = FakeDevice()
    dev.malloc(int(19.5 * MiB))  # a 20 MiB segment; the 0.5 MiB tail stays with the block
    assert dev.reserved == 20 * MiB
    assert dev.allocated == 20 * MiB  # the allocator counts block sizes, not requests
    (seg,) = dev.snapshot()["segments"]
    assert seg["blocks"][0]["requested_size"] == int(19.5 * MiB)


def test_a_units_slow_readings_start_after_its_first_step(tmp_path: Path) -> None:
    """A check does not read the slow metrics for the next unit itself: the next step does,
    after what that step allocated (an optimizer's state at its first step). Read at the check,
    the unit's first rows would show memory from before that step, and its floor would miss
    what the step kept until the background's next pass."""
    dev = FakeDevice(total_bytes=256 * MiB)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, interval_s=3600.0,
                        analyze=False) as mw:
        handles = [dev.malloc(3 * MiB)]
        mw.step()
        mw.end_epoch()
        handles.append(dev.malloc(100 * MiB))  # the next unit's first step keeps 100 MiB more
        mw.step()
        after_first = mw.latest()
        handles.append(dev.malloc(50 * MiB))
        mw.step()
        later = mw.latest()
    reserved = after_first["device.reserved"]
    assert reserved >= 103 * MiB
    assert after_first["device.free"] == 256 * MiB - reserved
    assert later["device.free"] == after_first["device.free"]  # not every step
