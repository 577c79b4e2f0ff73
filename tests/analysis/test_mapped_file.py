"""RSS by kind (anonymous, file-backed, shared memory) and the ``mapped_file`` finding.

Pages of a memory-mapped dataset count in RSS but are page cache the kernel reclaims: a loop
reading an ``np.memmap`` is a ``mapped_file`` finding, never a leak or allocator retention, and a
real leak beside it (tensors, numpy arrays, DataLoader batches in shared memory) is still a leak,
on the part of RSS that grows. Scripted series drive the analyzer's thresholds; real loops run in
their own interpreter (``mapped_file_scenarios.py``: RSS is per process).
"""

from __future__ import annotations

import json
import mmap
import os
import sys
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memwatch
import zygote
from memwatch.analysis import Analyzer, AnalyzerConfig, CheckContext
from memwatch.probes import procfs
from memwatch.probes.host import HostProbe
from memwatch.timeline import Timeline

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

HERE = Path(__file__).parent
MIB = 1 << 20
KEYS = ["host.rss", "host.rss_anon", "host.rss_file", "host.rss_shmem"]


def _data_file(tmp_path: Path, size: int = 64 * MIB) -> Path:
    path = tmp_path / "data.bin"
    np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tofile(path)
    return path


def _touch(m: Any) -> None:
    """Read one byte per page: every page of the map becomes resident."""
    int(np.asarray(m)[:: mmap.PAGESIZE].sum())


# --------------------------------------------------------------------------- the probe

def test_parse_rss_split() -> None:
    text = (b"Name:\tpython\nVmRSS:\t  307200 kB\nRssAnon:\t  204800 kB\n"
            b"RssFile:\t   98304 kB\nRssShmem:\t    4096 kB\nVmSwap:\t 0 kB\n")
    s = procfs.parse_rss_split(text)
    assert s == procfs.RssSplit(anon=200.0 * MIB, file=96.0 * MIB, shmem=4.0 * MIB)
    assert procfs.parse_rss_split(b"VmRSS:\t 1 kB\n") is None  # kernels before 4.5
    assert procfs.parse_rss_split(b"RssAnon:\tx kB\nRssFile:\t1 kB\n") is None


def test_split_adds_up_to_rss() -> None:
    s = procfs.read_rss_split(os.getpid())
    rss = procfs.rss_now()
    assert s is not None and rss is not None
    assert s.anon > 0 and s.file > 0 and s.shmem >= 0
    assert abs(s.anon + s.file + s.shmem - rss) <= 4 * MIB


def test_mapped_pages_are_file_backed_and_heap_is_anonymous(tmp_path: Path) -> None:
    p = HostProbe()
    try:
        before = p.read_slow()
        m = np.memmap(_data_file(tmp_path), dtype=np.uint8, mode="r")
        _touch(m)
        mapped = p.read_slow()
        # Written: anonymous pages. A fresh private map, not an array the allocator might place
        # on pages it already holds resident (a 64 MiB np.ones once left RssAnon unmoved).
        ballast = mmap.mmap(-1, 64 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        ballast[:: mmap.PAGESIZE] = b"\x01" * len(range(0, 64 * MIB, mmap.PAGESIZE))
        heap = p.read_slow()
        ballast.close()
        del m
    finally:
        p.close()
    assert mapped["host.rss_file"] - before["host.rss_file"] >= 60 * MIB
    assert abs(mapped["host.rss_anon"] - before["host.rss_anon"]) < 8 * MIB
    assert heap["host.rss_anon"] - mapped["host.rss_anon"] >= 60 * MIB
    assert abs(heap["host.rss_file"] - mapped["host.rss_file"]) < 8 * MIB


def test_shared_memory_is_not_file_backed() -> None:
    """What ``statm``'s "shared" field would have mixed up: shared memory is not reclaimable."""
    p = HostProbe()
    seg = shared_memory.SharedMemory(create=True, size=32 * MIB)
    try:
        before = p.read_slow()
        seg.buf[::mmap.PAGESIZE] = b"\x01" * len(range(0, 32 * MIB, mmap.PAGESIZE))
        after = p.read_slow()
        files = procfs.read_mapped_files(os.getpid())
    finally:
        seg.close()
        seg.unlink()
        p.close()
    assert after["host.rss_shmem"] - before["host.rss_shmem"] >= 30 * MIB
    assert abs(after["host.rss_file"] - before["host.rss_file"]) < 4 * MIB
    assert not [f for f, _ in files if seg.name in f]  # not a "mapped file" either


def test_mapped_files_name_the_data_file_not_libraries(tmp_path: Path) -> None:
    path = _data_file(tmp_path)
    m = np.memmap(path, dtype=np.uint8, mode="r")
    _touch(m)
    files = procfs.read_mapped_files(os.getpid())
    del m
    assert files[0][0] == str(path) and files[0][1] >= 60 * MIB
    assert not [f for f, _ in files if ".so" in f]  # code is mapped executable: left out
    text = (b"7f00-7f10 r--p 00000000 fe:00 12 /d/w.safetensors\nRss:  4096 kB\n"
            b"Anonymous:  1024 kB\n7f10-7f20 rw-s 00000000 00:01 3 /dev/shm/torch_1_2\n"
            b"Rss:  8192 kB\n")
    assert procfs.parse_mapped_files(text.splitlines()) == [("/d/w.safetensors", 3.0 * MIB)]


def test_host_limits_leave_file_pages_out() -> None:
    p = HostProbe()
    lim = p.limits()
    p.close()
    assert lim["host.rss_anon"] == lim["host.rss"] and "host.rss_file" not in lim


# --------------------------------------------------------------------------- the rules

def run_split(fn: Callable[[int], tuple[float, float, float]], keys: list[str] = KEYS,
              epochs: int = 4, steps: int = 200, **cfg: Any) -> list[list[memwatch.Finding]]:
    """Scripted (anon, file, shmem) per step through a real Timeline and Analyzer."""
    rng = np.random.default_rng(1)
    tl, analyzer = Timeline(keys), Analyzer(AnalyzerConfig(**cfg))
    out = []
    for e in range(epochs):
        for i in range(steps):
            s = e * steps + i
            anon, file, shmem = fn(s)
            anon += rng.normal(0, 0.3 * MIB)
            row = {"host.rss": anon + file + shmem, "host.rss_anon": anon,
                   "host.rss_file": file, "host.rss_shmem": shmem}
            tl.append(s, float(s), [row[k] for k in keys])
        summary = tl.end_epoch()
        assert summary is not None
        # the data file a real run would have mapped (smaps lists it): scripted here
        out.append(analyzer.check(summary, CheckContext(
            census="never", limits={"host.rss": 64.0 * 2**30},
            mapped_files=lambda: [("/data/train.bin", 4.0 * 2**30)])))
    return out


def found(per_epoch: list[list[memwatch.Finding]]) -> list[tuple[str, str]]:
    return sorted({(f.kind, f.metric) for fs in per_epoch for f in fs})


def test_growth_of_file_pages_is_mapped_file_not_a_leak() -> None:
    per_epoch = run_split(lambda s: (500 * MIB, 100 * MIB + s * 100_000, 0.0))
    assert found(per_epoch) == [("mapped_file", "host.rss")]
    f = per_epoch[1][0]  # the first check that can judge a leak says so, once
    assert f.severity == "info" and sum(len(fs) for fs in per_epoch) == 1
    assert f.evidence["file_share"] > 0.9
    # floor to floor over the stretch (the first epoch's warm-up is not in its floor)
    assert 80_000 < f.bytes_per_step < 110_000  # type: ignore[operator]
    assert "not a leak" in f.message and "np.memmap" in f.message
    assert any("np.fromfile" in s for s in f.suggestions)


def test_anonymous_leak_beside_a_mapped_file_is_still_a_leak() -> None:
    per_epoch = run_split(lambda s: (500 * MIB + s * 50_000, 100 * MIB + s * 100_000, 0.0))
    assert found(per_epoch) == [("leak", "host.rss_anon"), ("mapped_file", "host.rss")]
    leak = next(f for fs in per_epoch for f in fs if f.kind == "leak")
    assert abs(leak.bytes_per_step - 50_000) < 10_000  # type: ignore[operator]
    assert "anonymous" in leak.message
    mapped = next(f for fs in per_epoch for f in fs if f.kind == "mapped_file")
    assert "judged on its own" in mapped.message


def test_shared_memory_leak_beside_a_mapped_file_is_still_a_leak() -> None:
    per_epoch = run_split(lambda s: (500 * MIB, 100 * MIB + s * 100_000, s * 60_000.0))
    assert ("leak", "host.rss_shmem") in found(per_epoch)


def test_library_pages_are_not_a_mapped_dataset() -> None:
    """File-backed growth with no data file mapped (the code pages of libraries faulted in by
    the first steps and checks): RSS is judged as one, never called a mapped file."""
    rng = np.random.default_rng(1)
    tl, analyzer = Timeline(KEYS), Analyzer(AnalyzerConfig())
    kinds = set()
    for e in range(4):
        for i in range(200):
            s = e * 200 + i
            row = {"host.rss_anon": 500 * MIB + rng.normal(0, 0.3 * MIB),
                   "host.rss_file": 100 * MIB + s * 100_000, "host.rss_shmem": 0.0}
            row["host.rss"] = sum(row.values())
            tl.append(s, float(s), [row[k] for k in KEYS])
        summary = tl.end_epoch()
        assert summary is not None
        kinds |= {f.kind for f in analyzer.check(summary, CheckContext(
            census="never", limits={"host.rss": 64.0 * 2**30},
            mapped_files=lambda: [("/usr/share/locale/C.utf8/LC_CTYPE", 128 * 1024.0)]))}
    assert "mapped_file" not in kinds


def test_mostly_anonymous_growth_is_judged_as_rss_as_before() -> None:
    per_epoch = run_split(lambda s: (500 * MIB + s * 100_000, 100 * MIB + s * 20_000, 0.0))
    assert found(per_epoch) == [("leak", "host.rss")]


def test_without_the_split_rss_is_judged_as_one() -> None:
    per_epoch = run_split(lambda s: (500 * MIB, 100 * MIB + s * 100_000, 0.0),
                          keys=["host.rss"])
    assert found(per_epoch) == [("leak", "host.rss")]


def test_mapped_file_share_decides() -> None:
    fn: Callable[[int], tuple[float, float, float]] = \
        lambda s: (500 * MIB + s * 50_000, 100 * MIB + s * 100_000, 0.0)  # noqa: E731
    assert found(run_split(fn, mapped_file_share=0.9)) == [("leak", "host.rss")]
    with pytest.raises(ValueError, match="mapped_file_share"):
        AnalyzerConfig(mapped_file_share=1.5)


# --------------------------------------------------------------------------- real loops

_runs: dict[str, dict[str, Any]] = {}


def scenario(mode: str, tmp_path: Path, *extra: str) -> list[list[dict[str, Any]]]:
    key = " ".join((mode, *extra))
    if key not in _runs:  # each loop costs seconds
        out = tmp_path / f"{mode}.json"
        zygote.script(HERE / "mapped_file_scenarios.py", [mode, str(tmp_path), str(out), *extra],
                      cwd=tmp_path, env=dict(os.environ, PYTHONWARNINGS="error"), timeout=120)
        _runs[key] = json.loads(out.read_text())
    if _runs[key].get("tmpfs"):
        pytest.skip("the temporary folder is tmpfs: mapped pages are shared memory there")
    return _runs[key]["epochs"]  # type: ignore[no-any-return]


def kinds(epochs: list[list[dict[str, Any]]]) -> list[tuple[str, str]]:
    return sorted({(f["kind"], f["metric"]) for fs in epochs for f in fs})


def test_reading_a_memmap_dataset_is_mapped_file(tmp_path: Path) -> None:
    epochs = scenario("clean", tmp_path)
    assert kinds(epochs) == [("mapped_file", "host.rss")]
    f = next(f for fs in epochs for f in fs)
    assert f["severity"] == "info" and "train.bin" in f["culprit"]
    ev = f["evidence"]
    assert ev["file_share"] > 0.75
    assert ev["anon_growth_bytes"] < ev["file_growth_bytes"] / 4
    assert ev["mapped_files"][0]["path"].endswith("train.bin")


@pytest.mark.parametrize(("mode", "metric", "culprit"), [
    ("tensors", "host.rss_anon", "kept"),  # the census names the list
    ("numpy", "host.rss_anon", "mapped_file_scenarios.py"),  # tracemalloc names the line
    ("batches", "host.rss_shmem", "kept"),  # DataLoader batches live in shared memory
])
def test_a_leak_beside_a_memmap_dataset_is_still_a_leak(mode: str, metric: str, culprit: str,
                                                        tmp_path: Path) -> None:
    epochs = scenario(mode, tmp_path)
    leaks = [f for fs in epochs for f in fs if f["kind"] == "leak"]
    # host.rss itself only while the parts' background reads show no trend yet and the census
    # already names the live objects (never a culprit-less verdict on RSS as one)
    assert leaks and {f["metric"] for f in leaks} <= {"host.rss", "host.rss_anon",
                                                      "host.rss_shmem"}
    assert all(f["culprit"] for f in leaks if f["metric"] == "host.rss")
    assert leaks[-1]["metric"] == metric and culprit in leaks[-1]["culprit"]
    assert not [f for fs in epochs for f in fs if f["kind"] == "allocator_retention"]


def test_well_sampled_parts_find_the_leak_at_the_first_verdict(tmp_path: Path) -> None:
    """Epochs several background reads long (a real run's): the anonymous leak is named at the
    end of epoch 1, the first check at which RSS as one could have been judged a leak. (Epochs
    shorter than ``interval_s`` show each part as a few flat reads: the floors of a third epoch
    decide, one epoch later.)"""
    epochs = scenario("tensors", tmp_path, "sampled")
    assert [(f["kind"], f["metric"]) for f in epochs[1]] == [
        ("mapped_file", "host.rss"), ("leak", "host.rss_anon")]
    assert "kept" in epochs[1][1]["culprit"]


# --------------------------------------------------------------------------- the watchdog

def test_watchdog_host_scope_leaves_mapped_pages_out(tmp_path: Path) -> None:
    m = np.memmap(_data_file(tmp_path), dtype=np.uint8, mode="r")
    _touch(m)
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / "out", signals=False,
                        analyze=False, watchdog={"every_n_steps": 1}) as mw:
        mw.step()
        util = mw.watchdog.utilization()  # type: ignore[union-attr]
        latest = mw.latest()
    del m
    assert latest["host.rss_file"] >= 60 * MIB
    _, metric, value, limit = util["host"]
    assert metric == "host.rss"
    assert value == pytest.approx(latest["host.rss"] - latest["host.rss_file"])
    assert value <= latest["host.rss"] - 60 * MIB
