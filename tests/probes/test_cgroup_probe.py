"""CgroupProbe: fake v1/v2 trees for every layout, and the real kernel (numbers, a real OOM kill).

The real-kernel tests create a child memory cgroup under this process's own (tests/cgroup_helpers)
and skip, saying why, where none can be created.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cgroup_helpers import MIB, ChildCgroup, KernelLog, NoWritableCgroup, child_cgroup_or_skip
from memwatch.probes.cgroup import (
    CgroupLocation,
    CgroupProbe,
    Unavailable,
    locate,
    parse_mountinfo,
    parse_proc_cgroup,
)

GIB = 1 << 30

V2_STAT = textwrap.dedent(
    """\
    anon 314572800
    file 104857600
    kernel 8388608
    shmem 0
    file_mapped 1048576
    inactive_anon 0
    active_anon 314572800
    inactive_file 83886080
    active_file 20971520
    unevictable 0
    """
)
V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 2\noom_kill {kills}\noom_group_kill 0\n"
MEMINFO = "MemTotal:       24683656 kB\nMemFree:        1000 kB\nMemAvailable:   2097152 kB\n"


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_v2(tmp_path: Path, cgroup: str = "/job.slice/train.scope", *, memory: bool = True) -> Path:
    """A fake unified hierarchy: proc files naming ``cgroup`` and a cgroup2 mount in tmp_path."""
    mnt = tmp_path / "sys/fs/cgroup"
    _w(tmp_path / "proc/self/cgroup", f"0::{cgroup}\n")
    _w(
        tmp_path / "proc/self/mountinfo",
        f"25 1 0:22 / {mnt} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "26 1 0:23 / /proc rw - proc proc rw\n",
    )
    _w(tmp_path / "proc/meminfo", MEMINFO)
    _w(mnt / "cgroup.controllers", "cpuset cpu io memory pids\n" if memory else "pids\n")
    d = mnt
    for part in [p for p in cgroup.split("/") if p]:
        d = d / part
        d.mkdir(parents=True, exist_ok=True)
        if memory:
            _w(d / "memory.max", "max\n")
    if memory and cgroup != "/":
        _w(mnt / "job.slice/memory.max", f"{GIB}\n")  # the parent's limit is the one that bites
        _w(d / "memory.max", "max\n")
        _w(d / "memory.current", f"{512 * MIB}\n")
        _w(d / "memory.stat", V2_STAT)
        _w(d / "memory.events", V2_EVENTS.format(kills=3))
        _w(d / "memory.events.local", V2_EVENTS.format(kills=1))
    return d


def probe_of(tmp_path: Path) -> CgroupProbe:
    return CgroupProbe(
        locate(proc=str(tmp_path / "proc"), sys_cgroup=str(tmp_path / "sys/fs/cgroup")),
        meminfo=str(tmp_path / "proc/meminfo"),
    )


# -- parsing --------------------------------------------------------------------------------


def test_parse_proc_cgroup_hybrid_v1_and_v2_lines() -> None:
    text = "9:name=systemd:/\n4:memory:/a/b\n3:cpu,cpuacct:/\n0::/\n"
    assert parse_proc_cgroup(text) == ("/a/b", "/")
    assert parse_proc_cgroup("0::/user.slice\n") == (None, "/user.slice")
    assert parse_proc_cgroup("5:cpu,memory:/x\n") == ("/x", None)


def test_parse_mountinfo_escapes_and_namespaced_root() -> None:
    text = (
        "35 31 0:32 /docker/abc /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "42 31 0:39 / /proc rw - proc proc rw\n"
    )
    m1, m2 = parse_mountinfo(text)
    assert (m1.root, m1.mountpoint, m1.fstype) == (
        "/docker/abc",
        "/sys/fs/cgroup/mem ory",
        "cgroup",
    )
    assert "memory" in m1.superopts
    assert (m2.fstype, m2.mountpoint) == ("cgroup2", "/sys/fs/cgroup/unified")


# -- fake v2 tree ---------------------------------------------------------------------------


def test_fake_v2_all_metrics(tmp_path: Path) -> None:
    leaf = fake_v2(tmp_path)
    p = probe_of(tmp_path)
    try:
        assert p.available and p.version == 2 and p.reason is None
        assert p.location is not None and p.location.path == str(leaf)
        assert p.location.cgroup == "/job.slice/train.scope"
        assert p.slow_keys == (
            "cgroup.usage", "cgroup.working_set", "cgroup.file", "cgroup.anon",
            "cgroup.limit", "cgroup.oom_kills", "cgroup.oom_kills_local", "system.available",
        )  # fmt: skip
        r = p.read_slow()
        assert r == {
            "cgroup.usage": 512.0 * MIB,
            "cgroup.working_set": 512.0 * MIB - 80 * MIB,  # usage - inactive_file
            "cgroup.file": 100.0 * MIB,
            "cgroup.anon": 300.0 * MIB,
            "cgroup.limit": float(GIB),  # the leaf says max; job.slice's 1 GiB applies
            "cgroup.oom_kills": 3.0,
            "cgroup.oom_kills_local": 1.0,
            "system.available": 2.0 * GIB,
        }
        assert p.limits() == {
            k: float(GIB)
            for k in ("cgroup.usage", "cgroup.working_set", "cgroup.file", "cgroup.anon")
        }
        assert p.oom_kills() == 3
        # Kept-open descriptors see new contents (pread at 0), like kernfs files do.
        _w(leaf / "memory.events", V2_EVENTS.format(kills=4))
        _w(leaf / "memory.max", f"{256 * MIB}\n")
        r = p.read_slow()
        assert r["cgroup.oom_kills"] == 4.0 and r["cgroup.limit"] == 256.0 * MIB
        assert p.oom_kills() == 4
        d = p.describe()
        assert d["version"] == 2 and d["limit"] == 256 * MIB and d["available"] is True
    finally:
        p.close()
        p.close()  # idempotent


def test_fake_v2_no_limit_anywhere(tmp_path: Path) -> None:
    fake_v2(tmp_path)
    _w(tmp_path / "sys/fs/cgroup/job.slice/memory.max", "max\n")
    p = probe_of(tmp_path)
    assert "cgroup.limit" not in p.read_slow()
    assert p.limits() == {}
    p.close()


def test_fake_v2_without_events_local(tmp_path: Path) -> None:
    leaf = fake_v2(tmp_path)
    (leaf / "memory.events.local").unlink()  # kernels before 5.2
    p = probe_of(tmp_path)
    assert "cgroup.oom_kills_local" not in p.slow_keys
    assert p.read_slow()["cgroup.oom_kills"] == 3.0
    p.close()


def test_fake_v2_removed_cgroup_turns_unavailable(tmp_path: Path) -> None:
    leaf = fake_v2(tmp_path)
    p = probe_of(tmp_path)
    # A removed kernfs file fails reads with ENODEV; a fake one is simplest emptied to garbage.
    _w(leaf / "memory.current", "gone\n")
    r = p.read_slow()
    assert r == {"system.available": 2.0 * GIB}
    assert not p.available and p.reason and str(leaf) in p.reason
    assert p.read_slow() == {"system.available": 2.0 * GIB}
    assert p.limits() == {} and p.oom_kills() is None
    p.close()


def test_fake_v2_root_cgroup_is_unavailable(tmp_path: Path) -> None:
    fake_v2(tmp_path, "/")
    p = probe_of(tmp_path)
    assert not p.available and p.reason is not None and "root cgroup" in p.reason
    assert p.slow_keys == ("system.available",)
    assert p.read_slow() == {"system.available": 2.0 * GIB}
    p.close()


def test_fake_v2_controller_not_enabled(tmp_path: Path) -> None:
    leaf = fake_v2(tmp_path)
    (leaf / "memory.current").unlink()
    loc = locate(proc=str(tmp_path / "proc"), sys_cgroup=str(tmp_path / "sys/fs/cgroup"))
    assert isinstance(loc, Unavailable) and "not enabled" in loc.reason


def test_fake_hybrid_without_memory_anywhere(tmp_path: Path) -> None:
    fake_v2(tmp_path, "/", memory=False)
    loc = locate(proc=str(tmp_path / "proc"), sys_cgroup=str(tmp_path / "sys/fs/cgroup"))
    assert isinstance(loc, Unavailable) and "no memory controller" in loc.reason


def test_fake_v2_unreadable_stat(tmp_path: Path) -> None:
    leaf = fake_v2(tmp_path)
    (leaf / "memory.stat").unlink()
    p = probe_of(tmp_path)
    assert not p.available and p.reason is not None and "memory.stat" in p.reason
    p.close()


def test_no_proc_is_unavailable(tmp_path: Path) -> None:
    p = CgroupProbe(locate(proc=str(tmp_path / "nothing")), meminfo=str(tmp_path / "nothing"))
    assert not p.available and p.reason is not None and "cgroup" in p.reason
    assert p.slow_keys == () and p.read_slow() == {}
    p.close()


def test_fake_v1_tree_hierarchical_limit_and_huge_values(tmp_path: Path) -> None:
    mnt = tmp_path / "sys/fs/cgroup/memory"
    leaf = mnt / "kubepods/pod1"
    _w(tmp_path / "proc/self/cgroup", "4:memory:/kubepods/pod1\n0::/\n")
    _w(tmp_path / "proc/self/mountinfo", f"35 31 0:32 / {mnt} rw - cgroup cgroup rw,memory\n")
    _w(tmp_path / "proc/meminfo", MEMINFO)
    huge = "9223372036854771712\n"
    for d in (mnt, mnt / "kubepods", leaf):
        _w(d / "memory.limit_in_bytes", huge)
    _w(leaf / "memory.usage_in_bytes", f"{300 * MIB}\n")
    _w(leaf / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    _w(
        leaf / "memory.stat",
        "cache 1\nrss 2\ninactive_file 3\n"
        f"hierarchical_memory_limit {700 * MIB}\n"  # from an ancestor the container cannot see
        f"total_cache {100 * MIB}\ntotal_rss {190 * MIB}\ntotal_inactive_file {60 * MIB}\n",
    )
    p = probe_of(tmp_path)
    assert p.version == 1 and "cgroup.oom_kills_local" not in p.slow_keys
    assert p.read_slow() == {
        "cgroup.usage": 300.0 * MIB,
        "cgroup.working_set": 240.0 * MIB,
        "cgroup.file": 100.0 * MIB,
        "cgroup.anon": 190.0 * MIB,
        "cgroup.limit": 700.0 * MIB,
        "cgroup.oom_kills": 2.0,
        "system.available": 2.0 * GIB,
    }
    p.close()


# -- the real kernel ------------------------------------------------------------------------


def test_this_process_cgroup_is_found_or_explained() -> None:
    p = CgroupProbe()
    try:
        if not p.available:
            assert p.reason
            return
        r = p.read_slow()
        assert r["cgroup.usage"] > 0 and r["cgroup.oom_kills"] >= 0
        assert 0 < r["cgroup.working_set"] <= r["cgroup.usage"]
        assert r["system.available"] > 0
    finally:
        p.close()


def _hold(mib: int) -> str:
    return (
        "import sys, time\n"
        f"x = b'\\x01' * ({mib} << 20)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )


def test_real_numbers_match_the_cgroup_files() -> None:
    with child_cgroup_or_skip(200 * MIB) as cg:
        proc = cg.popen([sys.executable, "-c", _hold(64)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        p = CgroupProbe(cg.location)
        try:
            r = p.read_slow()
            stat = dict(line.split() for line in cg.read("memory.stat").splitlines())
            if cg.version == 1:
                usage = int(cg.read("memory.usage_in_bytes"))
                file, anon = int(stat["total_cache"]), int(stat["total_rss"])
                inactive = int(stat["total_inactive_file"])
            else:
                usage = int(cg.read("memory.current"))
                file, anon, inactive = (
                    int(stat["file"]),
                    int(stat["anon"]),
                    int(stat["inactive_file"]),
                )
            tol = 2 * MIB  # the interpreter is idle, but the kernel batches charges per CPU
            assert abs(r["cgroup.usage"] - usage) <= tol
            assert abs(r["cgroup.working_set"] - (usage - inactive)) <= tol
            assert abs(r["cgroup.file"] - file) <= tol
            assert abs(r["cgroup.anon"] - anon) <= tol
            assert r["cgroup.anon"] >= 64 * MIB  # the child's bytes object
            assert r["cgroup.limit"] == 200 * MIB
            assert r["cgroup.oom_kills"] == 0.0
            assert p.limits()["cgroup.usage"] == 200 * MIB
        finally:
            p.close()
            proc.kill()
            proc.communicate()  # reaps it and closes the pipe


def test_real_removed_cgroup_turns_probe_unavailable() -> None:
    with child_cgroup_or_skip(64 * MIB) as cg:
        p = CgroupProbe(cg.location)
        assert p.read_slow()["cgroup.usage"] >= 0
        path = cg.path
        cg.remove()
        r = p.read_slow()  # ENODEV on the kept-open descriptors: no exception
        assert not p.available and p.reason is not None and path in p.reason
        assert set(r) <= {"system.available"}
        p.close()


_ALLOCATE_UNTIL_KILLED = textwrap.dedent(
    """
    import time
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        chunks.append(b"\\x01" * (8 << 20))  # touched pages: anon memory the cgroup is charged
    print("not killed", len(chunks) * 8, "MiB")
    """
)


@pytest.mark.slow
def test_real_kernel_oom_kill_is_counted() -> None:
    with child_cgroup_or_skip(200 * MIB) as cg:
        assert cg.parent is not None
        probe = CgroupProbe(cg.location)
        kmsg = KernelLog()
        try:
            before = probe.oom_kills()
            parent_before = ChildCgroup.parent_oom_kills(cg.parent)
            t0 = time.monotonic()
            res = cg.run_python(_ALLOCATE_UNTIL_KILLED, timeout=90)
            elapsed = time.monotonic() - t0
            assert res.returncode == -signal.SIGKILL, (res.returncode, res.stdout, res.stderr)
            assert elapsed < 60
            assert before == 0 and probe.oom_kills() == 1 and cg.oom_kills() == 1
            r = probe.read_slow()
            assert r["cgroup.oom_kills"] == 1.0
            if cg.version == 2:
                assert cg.oom_kills(local=True) == 1 and r["cgroup.oom_kills_local"] == 1.0
            parent_delta = ChildCgroup.parent_oom_kills(cg.parent) - parent_before
            if cg.version == 2:
                # memory.events is hierarchical unless mounted with memory_localevents.
                assert parent_delta == (0 if _v2_localevents(cg.parent.mount) else 1)
            elif _kernel() >= (5, 7):
                # v1 memory.oom_control counts this cgroup only (5.2-5.6 propagated it upwards).
                assert parent_delta == 0
            if kmsg.readable:
                lines = [m for _, m in kmsg.read() if "Killed process" in m or "oom-kill:" in m]
                assert any(cg.name in m for m in lines), lines
        finally:
            kmsg.close()
            probe.close()


def _kernel() -> tuple[int, int]:
    major, minor = platform.release().split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _v2_localevents(mount: str) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4] == mount:
                    return "memory_localevents" in line
    except OSError:
        pass
    return False


def test_location_by_pid_is_the_same_as_self() -> None:
    assert locate(os.getpid()) == locate()


def test_child_cgroup_refuses_a_hierarchy_root(tmp_path: Path) -> None:
    root = CgroupLocation(1, str(tmp_path), str(tmp_path), "/")
    with pytest.raises(NoWritableCgroup, match="never at a hierarchy root"):
        ChildCgroup(64 * MIB, parent=root).create()
    assert list(tmp_path.iterdir()) == []
    gone = CgroupLocation(1, str(tmp_path / "a/b"), str(tmp_path), "/a/b")
    with pytest.raises(NoWritableCgroup, match="cannot create"):
        ChildCgroup(64 * MIB, parent=gone).create()
