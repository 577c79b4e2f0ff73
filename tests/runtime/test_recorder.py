"""Flight recorder, in process: FakeDevice OOMs captured before unwind, tagging, one bundle per
exception, classification, retention, trimming, hooks, failure containment, planted secrets."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import memwatch
from memwatch.bundle import TMP_PREFIX, find_bundles, host_name, open_bundle
from memwatch.core import safepickle
from memwatch.core.errors import ConfigError
from memwatch.core.oom import classify, parse_oom_message
from memwatch.testing import FakeDevice

MIB = 1 << 20


def complete_bundles(out: Path) -> list[Path]:
    root = out / "oom"
    if not root.is_dir():
        return []
    found = []
    for p, b in find_bundles(root):
        if not isinstance(b, Exception):
            found.append(p)
    return found


# ---------------------------------------------------------------- the pre-unwind capture
def test_fake_oom_bundle_is_captured_before_unwind(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=64 * MIB)
    caught: BaseException | None = None

    def train() -> None:
        # The tensors live in this frame: once the exception unwinds it, they are freed.
        handles = [dev.malloc(3 * MIB) for _ in range(18)]
        try:
            dev.malloc(40 * MIB)
        finally:
            for h in handles:
                dev.free(h)

    try:
        with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False) as mw:
            for _ in range(5):
                mw.step()
            train()
    except Exception as e:
        caught = e
    assert caught is not None
    assert type(caught).__name__ == "OutOfMemoryError"
    assert dev.allocated == 0  # after the unwind nothing is alive any more
    bundles = complete_bundles(tmp_path)
    assert len(bundles) == 1
    b = open_bundle(bundles[0])
    assert caught.memwatch_bundle == bundles[0]  # type: ignore[attr-defined]
    assert any(str(bundles[0]) in n for n in caught.__notes__)
    m = b.manifest
    assert m["pre_unwind"] is True and m["classification"] == "cuda_oom"
    assert m["trigger"] == "exception"
    # The allocator state in the bundle shows the 18 live 3 MiB blocks of the failing moment.
    alloc = b.read_json("allocator.json")
    assert alloc["memory_stats"]["allocated_bytes.all.current"] == 18 * 3 * MIB
    assert alloc["memory_stats"]["allocation.all.current"] == 18
    snap = b.snapshot()
    live = [blk for seg in snap["segments"] for blk in seg["blocks"]
            if blk["state"] == "active_allocated"]
    assert len(live) == 18 and {blk["requested_size"] for blk in live} == {3 * MIB}
    exc = b.read_json("exception.json")
    assert exc["classification"] == "cuda_oom"
    assert exc["numbers"]["tried_to_allocate"] == 40 * MIB
    assert exc["numbers"]["total_capacity"] == 64 * MIB
    assert "Traceback" in exc["traceback"] and "train" in exc["traceback"]
    mem = b.read_json("memory.json")
    assert mem["observer"]["tried_to_allocate"] == 40 * MIB
    for f in ("manifest.json", "exception.json", "timeline.jsonl", "findings.json",
              "environment.json", "census.json", "allocator.json", "snapshot.pickle",
              "report.html"):
        assert (bundles[0] / f).is_file(), f
    samples = [r for r in b.timeline() if r["type"] == "sample"]
    assert [r["step"] for r in samples] == [1, 2, 3, 4, 5]


def test_one_bundle_per_exception_and_same_object_propagates(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=32 * MIB)
    with pytest.raises(Exception) as info:
        with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False) as mw:
            try:
                dev.malloc(64 * MIB)
            except Exception as e:
                first = mw.handle_exception(e)
                assert mw.handle_exception(e) == first  # integration + watch(): no second bundle
                raise
    assert info.value.memwatch_bundle == first  # type: ignore[attr-defined]
    assert len(complete_bundles(tmp_path)) == 1


def test_wrapped_oom_reuses_the_bundle(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=32 * MIB)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False) as mw:
        try:
            try:
                dev.malloc(64 * MIB)
            except Exception as inner:
                p1 = mw.handle_exception(inner)
                raise RuntimeError("trainer failed") from inner
        except RuntimeError as outer:
            assert mw.handle_exception(outer) == p1
    assert len(complete_bundles(tmp_path)) == 1


def test_close_in_finally_handles_the_exception_in_flight(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=32 * MIB)
    mw = memwatch.MemWatch(device=dev, workers=False, out_dir=tmp_path, signals=False).start()
    with pytest.raises(RuntimeError) as info:
        try:
            dev.malloc(64 * MIB)
        finally:
            mw.close()  # runs before any excepthook would
    (b,) = complete_bundles(tmp_path)
    m = open_bundle(b).manifest
    assert m["trigger"] == "exception" and m["pre_unwind"] is True
    assert "exception.json" in m["files"] and info.value.memwatch_bundle == b  # type: ignore


def test_caught_oom_is_flushed_at_close(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=32 * MIB)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False):
        try:
            dev.malloc(64 * MIB)
        except Exception:
            pass  # the program recovers (a batch-size finder would)
    (b,) = complete_bundles(tmp_path)
    m = open_bundle(b).manifest
    assert m["trigger"] == "oom_observer" and m["pre_unwind"] is True


def test_caught_oom_is_flushed_at_a_later_step_boundary(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=32 * MIB)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False,
                        watchdog={"every_n_steps": 1}) as mw:
        try:
            dev.malloc(64 * MIB)
        except Exception:
            pass
        mw.step()  # the step the OOM happened in ends: the program caught it
        assert complete_bundles(tmp_path) == []  # too fresh: its exception may still be on the way
        time.sleep(1.1)  # wall time decides nothing: still one step after the capture
        mw._runtime.watch(mw.step_count)
        assert complete_bundles(tmp_path) == []
        mw.step()  # a step more: counted in steps, however long (or short) it took
        (b,) = complete_bundles(tmp_path)  # written while the run goes on, not only at close
    assert open_bundle(b).manifest["trigger"] == "oom_observer"
    assert len(complete_bundles(tmp_path)) == 1


# ---------------------------------------------------------------- classification
def test_classification_and_message_numbers() -> None:
    cur = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 "
           "GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process has 77.60 "
           "GiB memory in use. Of the allocated memory 70.00 GiB is allocated by PyTorch, and "
           "7.25 GiB is reserved by PyTorch but unallocated.")
    n = classify(RuntimeError(cur)).numbers
    assert n == {"tried_to_allocate": 2 << 30, "total_capacity": round(79.15 * (1 << 30)),
                 "free": 3 << 29, "in_use_by_process": round(77.60 * (1 << 30)),
                 "allocated_by_pytorch": 70 << 30, "reserved_unallocated": round(7.25 * (1 << 30)),
                 "gpu": 1}
    old = ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
           "14.56 GiB already allocated; 3.44 MiB free; 14.71 GiB reserved in total by PyTorch)")
    n = parse_oom_message(old)
    assert n["tried_to_allocate"] == 20 * MIB and n["free"] == round(3.44 * MIB)
    assert n["reserved_by_pytorch"] == round(14.71 * (1 << 30))
    mps = ("MPS backend out of memory (MPS allocated: 18.12 GB, other allocations: 4.20 MB, max "
           "allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.")
    c = classify(RuntimeError(mps))
    assert c.kind == "mps_oom" and c.numbers["tried_to_allocate"] == 256 * MIB
    cpu = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
           "you tried to allocate 17179869184 bytes. Error code 12 (Cannot allocate memory)")
    c = classify(RuntimeError(cpu))
    assert c.kind == "host_oom" and c.numbers["tried_to_allocate"] == 16 << 30
    assert classify(MemoryError()).kind == "host_oom"
    assert classify(OSError(12, "Cannot allocate memory")).kind == "host_oom"  # fork() failed
    assert classify(OSError(2, "No such file")).kind == "other"
    assert classify(RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be "
                                 "asynchronously reported")).kind == "cuda_oom"
    assert classify(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                                 "`cublasCreate(handle)`")).kind == "cuda_oom"
    assert classify(ValueError("x")).kind == "other"
    try:
        try:
            raise MemoryError
        except MemoryError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as w:
        assert classify(w).kind == "host_oom"


def test_only_ooms_write_bundles_by_default(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False):
            raise ValueError("not memory")
    assert complete_bundles(tmp_path) == []
    with pytest.raises(ValueError):
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                            bundle_on="all"):
            raise ValueError("not memory")
    (b,) = complete_bundles(tmp_path)
    assert open_bundle(b).manifest["classification"] == "other"
    with pytest.raises(MemoryError):
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / "h", signals=False):
            raise MemoryError("host is full")
    (b,) = complete_bundles(tmp_path / "h")
    m = open_bundle(b).manifest
    assert m["classification"] == "host_oom" and m["pre_unwind"] is False
    assert "allocator.json" not in m["files"]  # no device: no allocator statistics


def test_capture_oom_and_dump(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=32 * MIB)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False,
                        bundle_on="none") as mw:
        with pytest.raises(Exception) as info:
            with mw.capture_oom():
                dev.malloc(64 * MIB)
        forced = info.value.memwatch_bundle  # type: ignore[attr-defined]
        assert forced is not None and open_bundle(forced).manifest["pre_unwind"] is True
        with pytest.raises(KeyError):
            with mw.capture_oom():
                raise KeyError("x")  # not an OOM, bundle_on="none": re-raised, no bundle
        p = mw.dump("checkpoint before eval")
    assert p is not None
    m = open_bundle(p).manifest
    assert m["trigger"] == "manual" and m["reason"] == "checkpoint before eval"
    assert "exception.json" not in m["files"]
    assert len(complete_bundles(tmp_path)) == 2


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="bundle_on"):
        memwatch.MemWatch(bundle_on="sometimes")
    with pytest.raises(ConfigError, match="max_bundles"):
        memwatch.MemWatch(max_bundles=0)
    with pytest.raises(ConfigError, match="max_total_bytes"):
        memwatch.MemWatch(max_bundle_bytes=10 * MIB, max_total_bytes=MIB)
    with pytest.raises(ConfigError, match="bundle_report='pdf': use one of 'auto', 'full'"):
        memwatch.MemWatch(bundle_report="pdf")


def test_bundle_report_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """full: charts (plotly.js inlined); tables: a few KiB; none: no report.html; auto: full,
    but tables for a distributed job's signal bundles (1,024 survivors x 5 MB would be 5 GB)."""
    def report_of(path: Path | None) -> str | None:
        assert path is not None
        files = open_bundle(path).manifest["files"]
        return (path / "report.html").read_text() if "report.html" in files else None

    def one(mode: str, trigger: str) -> str | None:
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / f"{mode}-{trigger}",
                            signals=trigger == "signal", bundle_report=mode) as mw:
            for _ in range(5):
                mw.step()
            if trigger == "signal":
                os.kill(os.getpid(), signal.SIGUSR1)  # memwatch's handler: bundle, go on
                time.sleep(0.05)
                (path,) = complete_bundles(tmp_path / f"{mode}-{trigger}")
                return report_of(path)
            return report_of(mw.dump("look"))

    full = one("full", "manual")
    assert full is not None and "id='mw-figures'" in full and len(full) > 1_000_000
    tables = one("tables", "manual")
    assert tables is not None and "id='mw-figures'" not in tables and len(tables) < 200_000
    assert "Charts are left out to keep this bundle small" in tables
    assert one("none", "manual") is None
    # auto, one process: every bundle has the charts, a signal's too
    auto_single = one("auto", "signal")
    assert auto_single is not None and "id='mw-figures'" in auto_single
    # auto, rank 1 of a 2-rank job: the survivor's signal bundle is tables only, a manual or
    # failure bundle still gets the charts
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    (tmp_path / "auto-signal").rename(tmp_path / "auto-signal-single")
    auto_sig = one("auto", "signal")
    assert auto_sig is not None and "id='mw-figures'" not in auto_sig
    auto_manual = one("auto", "manual")
    assert auto_manual is not None and "id='mw-figures'" in auto_manual


# ---------------------------------------------------------------- bounds
def test_retention_by_count_and_size(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                        max_bundles=3) as mw:
        paths = [mw.dump(f"d{i}") for i in range(5)]
    kept = complete_bundles(tmp_path)
    assert len(kept) == 3 and paths[-1] in kept and paths[0] not in kept
    size = sum(f.stat().st_size for f in kept[-1].iterdir())
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / "s", signals=False,
                        max_bundle_bytes=int(size * 1.2),
                        max_total_bytes=int(size * 2.5)) as mw:
        for i in range(4):
            mw.dump(f"s{i}")
    assert len(complete_bundles(tmp_path / "s")) == 2


def test_oversized_bundle_is_trimmed_not_deleted(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=64 << 30)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False,
                        max_bundle_bytes=64 * 1024) as mw:
        for _ in range(1500):  # many blocks: a snapshot of a few hundred KiB
            dev.malloc(600 * 1024)
        p = mw.dump("big")
    assert p is not None
    b = open_bundle(p)
    trimmed = [t["file"] for t in b.manifest["trimmed"]]
    assert "snapshot.pickle" in trimmed and not (p / "snapshot.pickle").exists()
    assert b.manifest["bytes"] <= 64 * 1024
    for required in ("environment.json", "findings.json", "memory.json"):
        assert (p / required).is_file()


def test_report_is_added_after_the_evidence_is_committed(tmp_path: Path) -> None:
    """report.html comes after the rename (a kill while it renders leaves a complete bundle):
    a half-written ``.part`` is ignored by readers, the manifest lists the report once added,
    and a report over the size limit is dropped and listed as trimmed."""
    from memwatch.bundle.format import BundleWriter, add_file, note_error

    w = BundleWriter(tmp_path / "oom", "20260101T000000Z-h-rank0-pid1")
    for f in ("environment.json", "findings.json", "memory.json"):
        w.write_json(f, {})
    path = w.commit({"trigger": "watchdog"})
    (path / "report.html.part").write_text("<html>half")  # killed mid-render
    assert "report.html" not in open_bundle(path).manifest["files"]
    assert add_file(path, "report.html", "<html>done</html>")
    b = open_bundle(path)  # validates every listed file and its size
    assert b.manifest["files"]["report.html"] == len("<html>done</html>")
    assert b.manifest["bytes"] == sum(b.manifest["files"].values())
    assert not add_file(path, "extra.html", "x" * 10_000, max_bytes=b.manifest["bytes"] + 100)
    b = open_bundle(path)
    assert "extra.html" not in b.manifest["files"] and not (path / "extra.html").exists()
    assert b.manifest["trimmed"] == [{"file": "extra.html", "bytes": 10_000}]
    note_error(path, "report.html", "MemoryError: ")
    assert open_bundle(path).manifest["errors"] == {"report.html": "MemoryError: "}


def test_stale_temporary_bundles_are_cleaned_at_start(tmp_path: Path) -> None:
    root = tmp_path / "oom"
    root.mkdir()
    dead = root / f"{TMP_PREFIX}{host_name()}-{2**22 + 12345}-abcd1234"  # no such pid
    dead.mkdir()
    (dead / "exception.json").write_text("{}")
    alive = root / f"{TMP_PREFIX}{host_name()}-{os.getppid()}-abcd1234"  # a live writer
    alive.mkdir()
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False):
        pass
    assert not dead.exists() and alive.exists()


# ---------------------------------------------------------------- hooks and containment
def test_hooks_are_chained_and_restored(tmp_path: Path) -> None:
    before = (sys.excepthook, threading.excepthook, signal.getsignal(signal.SIGTERM),
              signal.getsignal(signal.SIGUSR1))
    seen: list[BaseException] = []

    def prev_hook(tp: type[BaseException], value: BaseException, tb: object) -> None:
        seen.append(value)

    sys.excepthook = prev_hook
    try:
        with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path) as mw:
            assert sys.excepthook is not prev_hook
            assert signal.getsignal(signal.SIGTERM) == mw.recorder.hooks._on_signal  # type: ignore
            err = MemoryError("from the hook")
            sys.excepthook(MemoryError, err, None)
            assert seen == [err] and err.memwatch_bundle is not None  # type: ignore[attr-defined]
            failures: list[BaseException] = []

            def worker() -> None:
                raise MemoryError("in a thread")

            prev_thread_hook = mw.recorder.hooks._prev_thread_hook  # type: ignore[union-attr]
            mw.recorder.hooks._prev_thread_hook = lambda a: failures.append(a.exc_value)  # type: ignore
            t = threading.Thread(target=worker)
            t.start()
            t.join()
            mw.recorder.hooks._prev_thread_hook = prev_thread_hook  # type: ignore[union-attr]
            assert len(failures) == 1 and failures[0].memwatch_bundle is not None  # type: ignore
        assert sys.excepthook is prev_hook
    finally:
        sys.excepthook = before[0]
    assert (threading.excepthook, signal.getsignal(signal.SIGTERM),
            signal.getsignal(signal.SIGUSR1)) == before[1:]
    assert len(complete_bundles(tmp_path)) == 2


def test_unwritable_out_dir_never_breaks_the_run(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # An out_dir that is a file is refused at start (ConfigError, tests/core/test_safefs.py);
    # one that stops being writable during the run (replaced by a file here) only warns.
    out = tmp_path / "out"
    err = MemoryError("full")
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        with pytest.raises(MemoryError) as info:
            with memwatch.watch(device="cpu", workers=False, out_dir=out, signals=False):
                shutil.rmtree(out)
                out.write_text("not a directory")
                raise err
    assert info.value is err
    assert err.memwatch_bundle is None  # type: ignore[attr-defined]
    assert "bundle not written" in caplog.text


def test_census_failure_is_recorded_not_fatal(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import memwatch.analysis.culprits.census.census as census_mod

    def broken(**kw: object) -> dict[str, object]:
        raise RuntimeError("census exploded")

    monkeypatch.setattr(census_mod, "take_census", broken)
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False) as mw:
        p = mw.dump("x")
    assert p is not None
    assert "census exploded" in json.loads((p / "census.json").read_text())["error"]


# ---------------------------------------------------------------- secrets
def test_planted_secrets_appear_nowhere_in_the_bundle(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "HF_TOKEN": "hf_PlantedSecretValue0123456789abcd",
        "WANDB_API_KEY": "fe1d0c5b7a2e4f6d8c9b0a1e2f3d4c5b6a7e8f90",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTED",
        "NCCL_SOCKET_PASSWORD": "nccl-planted-pass",
    }
    for k, v in secrets.items():
        monkeypatch.setenv(k, v)
    argv_secret = "argv-planted-password"
    gh = "ghp_PlantedGithubToken0123456789abcdefgh"
    url_pw = "urlplantedpw"
    monkeypatch.setattr(sys, "argv", ["train.py", f"--password={argv_secret}", "--lr", "0.1"])
    aws = "AKIAPLANTEDKEY123456"

    class TracedDevice(FakeDevice):
        # An allocation history whose stack frames carry a secret (a path, a function name).
        def snapshot(self) -> dict[str, object]:
            snap = super().snapshot()
            snap["device_traces"] = [[{"action": "alloc", "size": 512, "frames": [
                {"filename": f"/jobs/{aws}/train.py", "name": "step", "line": 3}]}]]
            return snap

    dev = TracedDevice(total_bytes=32 * MIB)
    with pytest.raises(RuntimeError):
        with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False,
                            bundle_on="all"):
            raise RuntimeError(f"push to https://me:{url_pw}@hub.example failed with {gh}")
    (b,) = complete_bundles(tmp_path)
    planted = [*secrets.values(), argv_secret, gh, url_pw, aws]
    assert (b / "snapshot.pickle").is_file()
    files = list(b.iterdir())
    assert len(files) >= 8
    for f in files:
        data = f.read_bytes()
        for s in planted:
            assert s.encode() not in data, (f.name, s)
    env = json.loads((b / "environment.json").read_text())
    assert env["env"]["HF_TOKEN"] == "<redacted>"  # present, so people know it was set
    assert env["argv"] == ["train.py", "--password=<redacted>", "--lr", "0.1"]


def test_bundle_write_time_is_bounded(tmp_path: Path) -> None:
    dev = FakeDevice(total_bytes=8 << 30)
    with memwatch.watch(device=dev, workers=False, out_dir=tmp_path, signals=False,
                        capacity=4096) as mw:
        for i in range(4096):
            if i % 8 == 0:
                dev.malloc(2 * MIB)
            mw.step()
        c0 = time.thread_time()
        p = mw.dump("timing")
        cpu_s = time.thread_time() - c0
    assert p is not None
    m = open_bundle(p).manifest
    # 2000 timeline rows, a 512-block snapshot, census and report: well under a second of
    # work. Bounded in this thread's CPU time (the bundle is written on it); the wall time
    # the manifest records is what a loaded machine stretches, so it is only reported.
    assert cpu_s < 2.0, cpu_s
    assert m["write_seconds"] > 0
    assert sum(1 for r in open_bundle(p).timeline() if r["type"] == "sample") == 2000
    assert safepickle.load(p / "snapshot.pickle")["segments"]
