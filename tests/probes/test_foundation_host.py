"""HostProbe: RSS per step from a kept-open statm, USS/PSS from smaps_rollup, and fork safety."""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

import psutil
import pytest

import memwatch
from memwatch.probes import procfs
from memwatch.probes.host import HostProbe
from memwatch.probes.malloc import MallocInfo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

MiB = 2**20


def test_rss_agrees_with_psutil() -> None:
    p = HostProbe()
    try:
        (rss,) = p.read_fast()
        ref = psutil.Process().memory_info().rss
        assert abs(rss - ref) <= max(0.03 * ref, 2 * MiB)
        # Touched pages of a fresh anonymous mapping: RSS must follow. Not a bytes object: a
        # worker that ran hundreds of tests first serves 64 MiB from freed heap pages that are
        # resident already (RSS grew 38 MiB once), whatever the load.
        ballast = mmap.mmap(-1, 64 * MiB)
        for off in range(0, 64 * MiB, mmap.PAGESIZE):
            ballast[off] = 1
        (rss2,) = p.read_fast()
        assert rss2 - rss >= 60 * MiB
        ballast.close()
    finally:
        p.close()


def test_uss_pss_from_smaps_rollup() -> None:
    p = HostProbe()
    slow = p.read_slow()
    p.close()
    malloc = {"host.malloc_in_use", "host.malloc_free"} if MallocInfo.open() else set()
    assert set(slow) == {"host.uss", "host.pss", "host.swap", "host.rss_anon", "host.rss_file",
                         "host.rss_shmem"} | malloc
    full = psutil.Process().memory_full_info()
    assert abs(slow["host.uss"] - full.uss) <= max(0.05 * full.uss, 4 * MiB)
    assert 0 < slow["host.uss"] <= slow["host.pss"] <= psutil.Process().memory_info().rss * 1.05


def test_limits_name_host_metrics() -> None:
    p = HostProbe()
    lim = p.limits()
    p.close()
    assert lim["host.rss"] > 0
    assert lim["host.rss"] <= psutil.virtual_memory().total


def test_close_is_idempotent() -> None:
    p = HostProbe()
    p.close()
    p.close()


def test_forked_child_reads_its_own_statm_not_the_parents(tmp_path: Path) -> None:
    p = HostProbe()
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=tmp_path).start()
    mw.step()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what a DataLoader worker is
        code = 1
        try:
            os.close(r)
            (before_growth,) = p.read_fast()
            ballast = b"\x01" * (96 * MiB)  # the child grows; the parent does not
            (mine,) = p.read_fast()
            with open(f"/proc/{os.getpid()}/statm", "rb") as f:
                truth = int(f.read().split()[1]) * procfs.PAGE_SIZE
            before = mw.step_count
            mw.step()  # the inherited session must be inert in the child
            inert = int(mw.step_count == before and not mw.running)
            grew = mine - before_growth
            os.write(w, f"{mine} {truth} {inert} {grew} {len(ballast)}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        data = b""
        while chunk := os.read(r, 1024):
            data += chunk
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    mine, truth, inert, grew, _ = (float(x) for x in data.split())
    (parent_rss,) = p.read_fast()
    assert abs(mine - truth) <= 2 * MiB, "the child read someone else's statm"
    assert grew >= 90 * MiB, "the child's reading did not see its own growth (parent's statm?)"
    assert inert == 1
    # ... and the parent's probe and session still read the parent.
    with open(f"/proc/{os.getpid()}/statm", "rb") as f:
        assert abs(parent_rss - int(f.read().split()[1]) * procfs.PAGE_SIZE) <= 2 * MiB
    mw.step()
    assert mw.step_count == 2 and mw.running
    mw.close()
    p.close()


def test_procfs_helpers() -> None:
    assert procfs.rss_of_pid(os.getpid()) is not None
    assert procfs.rss_of_pid(2**22 + 12345) is None  # beyond pid_max: no such process
    assert procfs.read_smaps_rollup(2**22 + 12345) is None
    assert procfs.read_comm(os.getpid())
    assert procfs.children_of(2**22 + 12345) == []
