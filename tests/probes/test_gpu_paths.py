"""Issue 18's CUDA paths that run without a GPU: device memory outside the caching allocator,
private pools (CUDA graphs) kept out of fragmentation, and a device leak joined to the
allocation site of its tensors through the allocator's recorded history. Scripted on
FakeDevice and a real Timeline + Analyzer; the same code runs on a GPU in ``make gpu-check``."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from memwatch.analysis import Analyzer, AnalyzerConfig, CheckContext
from memwatch.analysis.culprits import attribution as A
from memwatch.analysis.culprits.census import census as C
from memwatch.analysis.culprits.growth import device_sites
from memwatch.core.findings import Finding
from memwatch.probes.base import outside_allocator, private_pools
from memwatch.testing import FakeDevice
from memwatch.timeline import Timeline

MIB = 1 << 20
GIB = 1 << 30


def run(keys: list[str], fn: Callable[[int], dict[str, float]], epochs: int = 4,
        steps: int = 200) -> list[list[Finding]]:
    rng = np.random.default_rng(2)
    tl, analyzer = Timeline(keys), Analyzer(AnalyzerConfig())
    out = []
    for e in range(epochs):
        for i in range(steps):
            s = e * steps + i
            row = fn(s)
            row["device.allocated"] += rng.normal(0, 0.2 * MIB)
            tl.append(s, float(s), [row[k] for k in keys])
        summary = tl.end_epoch()
        assert summary is not None
        out.append(analyzer.check(summary, CheckContext(
            device_kind="fake", census="never",
            limits={"device.reserved": 16.0 * GIB, "device.allocated": 16.0 * GIB})))
    return out


def test_probe_arithmetic() -> None:
    assert outside_allocator(2 * GIB, 3 * GIB, None, None) == (1 * GIB, "nvml_process")
    assert outside_allocator(2 * GIB, None, 13 * GIB, 16 * GIB) == (1 * GIB, "device_wide")
    assert outside_allocator(2 * GIB, None, None, None) == (None, "none")
    stats = {"reserved_bytes_by_private_pools": {"0_1": {"all": {"current": 64 * MIB}},
                                                 "0_2": {"all": {"current": 32 * MIB}}}}
    assert private_pools(stats) == 96 * MIB
    assert math.isnan(private_pools({}))  # a torch without the counter: not measured, not 0


def test_fake_device_reads_outside_and_private_pools() -> None:
    dev = FakeDevice(total_bytes=GIB)
    dev.malloc(3 * MIB)
    dev.outside_bytes = 300 * MIB
    dev.private_pool_bytes = {"0_1": 40 * MIB}
    r = dev.read_slow()
    assert r["device.outside_allocator"] == 300 * MIB
    assert r["device.private_pools"] == 40 * MIB
    assert r["device.free"] == GIB - dev.reserved - 300 * MIB


KEYS = ["device.allocated", "device.reserved", "device.outside_allocator",
        "device.private_pools"]


def test_growth_outside_the_allocator_is_its_own_finding() -> None:
    per = run(KEYS, lambda s: {"device.allocated": 2.0 * GIB, "device.reserved": 2.5 * GIB,
                               "device.outside_allocator": 500 * MIB + s * 200_000,
                               "device.private_pools": 0.0})
    found = [f for fs in per for f in fs if f.metric == "device.outside_allocator"]
    assert found and found[0].kind == "leak"
    assert found[0].rule == "outside_allocator"
    assert "cuBLAS" in found[0].message and "NCCL" in found[0].message
    assert not [f for fs in per for f in fs if f.metric == "device.allocated"]


def test_flat_context_is_quiet() -> None:
    per = run(KEYS, lambda s: {"device.allocated": 2.0 * GIB, "device.reserved": 2.5 * GIB,
                               "device.outside_allocator": 500 * MIB,
                               "device.private_pools": 0.0})
    assert [f for fs in per for f in fs] == []


def _pools(counted: bool) -> list[Finding]:
    # CUDA graphs captured one after another: each reserves a private pool; allocated is flat
    keys = KEYS if counted else KEYS[:3]
    return [f for fs in run(keys, lambda s: {
        "device.allocated": 2.0 * GIB, "device.reserved": 2.5 * GIB + (s // 50) * 16 * MIB,
        "device.outside_allocator": 500 * MIB,
        "device.private_pools": (s // 50) * 16.0 * MIB}) for f in fs]


def test_private_pools_are_not_fragmentation() -> None:
    assert [f.kind for f in _pools(counted=False)].count("fragmentation") >= 1  # as before
    assert [f for f in _pools(counted=True) if f.kind in ("fragmentation", "leak")] == []


def test_fake_device_snapshot_keeps_frames_while_recording() -> None:
    dev = FakeDevice(total_bytes=GIB)
    before = dev.malloc(MIB)
    dev.record_history(True)
    h = dev.malloc(2 * MIB)
    snap = dev.snapshot()
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    by_addr = {b["address"]: b for b in blocks}
    assert "frames" not in by_addr[dev.address_of(before)]
    frames = by_addr[dev.address_of(h)]["frames"]
    assert frames[0]["filename"].endswith("test_gpu_paths.py")
    sites = device_sites.join(snap, [dev.address_of(h)])
    assert sites and sites[0].where.startswith("test_gpu_paths.py:")
    assert sites[0].where.endswith("in test_fake_device_snapshot_keeps_frames_while_recording")


def test_device_leak_joined_to_its_allocation_site() -> None:
    """The census's growing group -> its tensors' addresses -> the snapshot's recorded frames
    (a scripted snapshot at the tensors' real addresses: CPU tensors stand in for CUDA ones)."""
    kept: list[torch.Tensor] = []
    c0 = C.take_census()
    kept.extend(torch.ones(33, 7) for _ in range(12))
    c1 = C.take_census()
    g = next(x for x in C.diff(c0, c1, "cpu") if x.group.shape == (33, 7))
    frames = [{"filename": "/x/site-packages/torch/nn/modules/module.py", "line": 1, "name": "f"},
              {"filename": "/home/me/train.py", "line": 42, "name": "forward"}]
    snap = {"segments": [{"blocks": [
        {"address": t.data_ptr(), "size": 1024, "state": "active_allocated", "frames": frames}
        for t in kept]}]}
    sites = A.alloc_sites_of(g, CheckContext(device_snapshot=lambda: snap))
    assert sites and sites[0].where == "train.py:42 in forward" and sites[0].tensors == 12
    assert A.alloc_sites_of(g, CheckContext(device_snapshot=lambda: {"segments": []})) == []


def test_culprit_says_who_holds_and_where_allocated() -> None:
    from memwatch.analysis.culprits.wording import culprit_of
    from memwatch.analysis.evidence import Attribution, Holder

    g = C.GroupGrowth(C.Group("cuda:0", "torch.float32", (33, 7), False, ""), 12, 12 * 1024,
                      [])
    held = Holder("train.kept", "global", "list", 40, elements="tensors")
    a = Attribution(group=g, holder=held,
                      alloc_sites=[device_sites.AllocSite("train.py:42 in forward", 12, 12288,
                                                         ["train.py:42 in forward"])])
    culprit, _, detail = culprit_of("device.allocated", a)
    assert culprit is not None
    assert culprit.startswith("train.kept (list, 40 tensors, +12 since the last check)")
    assert culprit.endswith("allocated at train.py:42 in forward")
    assert "recorded history" in detail


class _CountingDevice(FakeDevice):
    """A FakeDevice that counts the hot path's reads of its counters."""

    reads = 0

    def read_fast(self):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().read_fast()


def test_dear_counters_are_read_at_most_every_interval(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On an H100 the allocator's counters call costs 9.9 us (a ~100-entry dict built per call)
    and made ``mw.step()`` 14.8 us: the CUDA probe declares ``fast_min_interval_s`` and the
    session reads it at most that often, repeating the last values between reads. A step that
    lasts the interval is read every time, and a transient peak between two reads is still in
    the next read's window peak."""
    import time

    import memwatch
    from memwatch.probes.cuda import FAST_MIN_INTERVAL_S, CudaProbe

    assert CudaProbe.fast_min_interval_s == FAST_MIN_INTERVAL_S > 0
    dev = _CountingDevice(total_bytes=1 << 30)
    dev.fast_min_interval_s = 0.010
    with memwatch.watch(device=dev, workers=False, out_dir=str(tmp_path), signals=False,
                        check_every_n_steps=None, check_every_s=None) as mw:
        t0 = time.perf_counter()
        for _ in range(3000):  # a tight loop: microseconds a step
            mw.step()
        elapsed = time.perf_counter() - t0
        assert dev.reads <= elapsed / 0.010 + 2, (dev.reads, elapsed)
        assert dev.reads >= 1
        before = dev.reads
        for _ in range(5):  # steps as long as the interval: each one read
            time.sleep(0.011)
            mw.step()
        assert dev.reads == before + 5
        h = dev.malloc(64 << 20)  # a spike that is gone before the next read
        dev.free(h)
        time.sleep(0.011)
        mw.step()
        assert mw.latest()["device.peak"] >= 64 << 20
        assert mw.latest()["device.allocated"] < 64 << 20
