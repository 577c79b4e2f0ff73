"""What memwatch writes on a shared machine: never through a planted symlink, private modes,
retention that touches only its own run, no ``.part`` left by a full disk. Real files, real
symlinks, real processes; a real small filesystem where root can mount one."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import memwatch
from memwatch.bundle import BundleWriter, clean_stale, open_bundle
from memwatch.bundle.blackbox import record_path
from memwatch.runtime.blackbox import BlackBox
from memwatch.sinks import JsonlSink
from memwatch.testing import FakeDevice

VICTIM = "the victim's file\n"
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_text(VICTIM)
    return v


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def oom_bundle(out: Path, **kw: object) -> Path:
    dev = FakeDevice(total_bytes=64 << 20)
    with memwatch.watch(device=dev, workers=False, out_dir=out, signals=False, **kw) as mw:
        mw.step()
        try:
            with mw.capture_oom():
                dev.malloc(128 << 20)
        except Exception as e:  # noqa: BLE001
            path: Path = e.memwatch_bundle  # type: ignore[attr-defined]
    return path


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---------------------------------------------------------------- symlinks planted
def test_black_box_never_writes_through_planted_symlinks(tmp_path: Path, victim: Path) -> None:
    out = tmp_path / "out"
    (out / "blackbox").mkdir(parents=True)
    rec = record_path(out)
    for name in (rec.name, rec.name + ".tmp", f".{rec.name}.tmp"):  # old and likely names
        (rec.parent / name).symlink_to(victim)
    with memwatch.watch(device="cpu", workers=False, out_dir=out, signals=False) as mw:
        mw.step()
        assert mw.blackbox is not None
        mw.blackbox.write()
        assert not rec.is_symlink() and mode(rec) == 0o600
        assert json.loads(rec.read_text())["kind"] == "memwatch-blackbox"
    assert victim.read_text() == VICTIM


def test_the_ended_move_never_writes_through_a_planted_symlink(tmp_path: Path,
                                                               victim: Path) -> None:
    out = tmp_path / "out"
    bb = out / "blackbox"
    (bb / "ended").mkdir(parents=True)
    pid = dead_pid()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    updated = 1_700_000_000.0
    doc = {"schema": 1, "kind": "memwatch-blackbox", "host": socket.gethostname(), "pid": pid,
           "proc_start": 1, "boot_id": boot, "started_unix": updated - 60.0,
           "updated_unix": updated, "step": 3, "epoch": 0, "latest": {}, "cgroup": None,
           "findings": [], "samples": []}
    name = f"{socket.gethostname()}-pid{pid}.json"
    (bb / name).write_text(json.dumps(doc))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(updated))
    for planted in (f"{stamp}-{socket.gethostname()}-pid{pid}.tmp", f"{stamp}-{name}"):
        (bb / "ended" / planted).symlink_to(victim)
    with memwatch.watch(device="cpu", workers=False, out_dir=out, signals=False) as mw:
        mw.step()
        assert len(mw.previous_unclean) == 1
    assert victim.read_text() == VICTIM
    moved = bb / "ended" / f"{stamp}-{name}"
    assert not moved.is_symlink() and json.loads(moved.read_text())["end"]["state"] == "unclean"


def test_a_temporary_bundle_directory_swapped_mid_write_is_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vdir = tmp_path / "victim_dir"
    vdir.mkdir()
    out = tmp_path / "out"
    monkeypatch.setenv("MEMWATCH_TEST_BUNDLE_PAUSE_S", "0.2")
    swapped = threading.Event()

    def attacker() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not swapped.is_set():
            try:
                for c in (out / "oom").iterdir():
                    if c.name.startswith(".tmp-") and not c.is_symlink() and any(c.iterdir()):
                        os.rename(c, tmp_path / "moved")
                        c.symlink_to(vdir)
                        swapped.set()
                        return
            except OSError:
                pass
            time.sleep(0.002)

    t = threading.Thread(target=attacker)
    t.start()
    with memwatch.watch(device="cpu", workers=False, out_dir=out, signals=False,
                        bundle_report="none") as mw:
        mw.step()
        path = mw.dump("look")
    t.join()
    assert swapped.is_set()
    assert list(vdir.iterdir()) == []  # nothing written into the victim's directory
    assert path is None  # the recorder noticed: not committed
    assert (tmp_path / "moved" / "memory.json").is_file()  # what it wrote went to its own dir


# ---------------------------------------------------------------- modes
def test_everything_written_is_private_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        out = tmp_path / "out"
        sink = JsonlSink(out / "events.jsonl")
        b = oom_bundle(out, sinks=[sink], log_every_n_steps=1)
        assert open_bundle(b).has("report.html")
    finally:
        os.umask(old)
    found = [out, *out.rglob("*")]
    assert len(found) > 12
    loose = [f"{p.relative_to(tmp_path)} {mode(p):o}" for p in found
             if mode(p) & 0o077]
    assert not loose, loose
    assert mode(out) == 0o700 and mode(b) == 0o700 and mode(b / "report.html") == 0o600


def test_group_share_makes_bundles_and_records_group_readable(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        w = BundleWriter(tmp_path / "oom", "b1", share="group")
        for f in ("environment.json", "findings.json", "memory.json"):
            w.write_json(f, {})
        p = w.commit({"trigger": "manual"})
        sink = JsonlSink(tmp_path / "logs" / "ev.jsonl", share="group")
        sink.on_metrics(1, {"host.rss": 1.0})
        sink.close()
    finally:
        os.umask(old)
    assert mode(tmp_path / "oom") == 0o750 and mode(p) == 0o750
    assert mode(p / "manifest.json") == 0o640 and mode(p / "memory.json") == 0o640
    assert mode(tmp_path / "logs") == 0o750 and mode(tmp_path / "logs" / "ev.jsonl") == 0o640
    with pytest.raises(memwatch.ConfigError, match="share="):
        BundleWriter(tmp_path / "oom", "b2", share="everyone")


def test_jsonl_sink_refuses_unsafe_paths(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "link.jsonl").symlink_to(victim)
    with pytest.raises(memwatch.ConfigError, match="is a symlink"):
        JsonlSink(tmp_path / "link.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(memwatch.ConfigError, match="not a regular file"):
        JsonlSink(tmp_path / "fifo.jsonl")
    world = tmp_path / "world"
    world.mkdir()
    os.chmod(world, 0o777)
    with pytest.raises(memwatch.ConfigError, match="writable by every user"):
        JsonlSink(world / "ev.jsonl")
    # A symlink planted after the sink was made: the log is not written through it, and the
    # run goes on (the sink set disables the sink with a warning).
    sink = JsonlSink(tmp_path / "late.jsonl")
    (tmp_path / "late.jsonl").symlink_to(victim)
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path / "out", signals=False,
                        sinks=[sink], log_every_n_steps=1) as mw:
        mw.step()
        mw.step()
    assert victim.read_text() == VICTIM


# ---------------------------------------------------------------- retention per run
_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, {src!r})
    import memwatch
    with memwatch.watch(device="cpu", workers=False, out_dir={out!r}, signals=False,
                        max_bundles=2, bundle_report="none") as mw:
        mw.step()
        for i in range({n}):
            print(mw.dump(f"d{{i}}"))
""")


def test_retention_deletes_only_this_runs_bundles(tmp_path: Path) -> None:
    out = tmp_path / "shared"
    # Another run of the same user in the same out_dir, with a report being added to one of
    # its bundles right now (a .part in it).
    theirs = [oom_bundle(out, bundle_report="none") for _ in range(3)]
    (theirs[0] / ".report.html.0123.part").write_text("<html>half")
    r = subprocess.run([sys.executable, "-c", _RUN.format(src=str(SRC), out=str(out), n=5)],
                       capture_output=True, text=True, timeout=120, check=True)
    mine = [Path(line) for line in r.stdout.split()]
    assert all(p.exists() for p in theirs)  # never another run's
    kept = [p for p in mine if p.exists()]
    assert kept == mine[-2:]  # this run's own oldest went, max_bundles=2


# ---------------------------------------------------------------- a full disk
_FULL = textwrap.dedent("""
    import resource, signal, sys
    sys.path.insert(0, {src!r})
    import memwatch
    from memwatch.testing import FakeDevice
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    dev = FakeDevice(total_bytes=64 << 20)
    with memwatch.watch(device=dev, workers=False, out_dir={out!r}, signals=False) as mw:
        mw.step()
        print(mw.dump("full"))
""")


def leftovers(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*")
            if p.name.endswith((".part", ".tmp")) or p.name.startswith(".tmp-")]


def test_writes_that_fail_leave_no_part_files(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes every write past 64 KiB fail (EFBIG), as a full disk would (ENOSPC):
    the report (5 MB with plotly.js) cannot be added, the bundle stays complete."""
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", _FULL.format(src=str(SRC), out=str(out),
                                                           limit=64 * 1024)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert leftovers(out) == []
    b = open_bundle(r.stdout.split()[-1])
    assert "File too large" in b.manifest["errors"]["report.html"]
    assert "report.html" not in b.manifest["files"]


def test_a_full_filesystem_leaves_no_part_files(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root (the RLIMIT_FSIZE test covers the rest)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {m.stderr.strip()}")
    try:
        path = oom_bundle(mnt / "out")  # report.html (about 5 MB) cannot fit in 1 MiB
        assert path is not None and open_bundle(path).manifest["complete"]
        assert leftovers(mnt) == []
        assert "report.html" in open_bundle(path).manifest["errors"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_part_files_of_a_killed_writer_are_cleaned_at_the_next_start(tmp_path: Path) -> None:
    b = oom_bundle(tmp_path, bundle_report="none")
    dead = b.with_name(b.name.rsplit("-pid", 1)[0] + f"-pid{dead_pid()}")
    b.rename(dead)
    (dead / ".report.html.abc.part").write_text("<html>half")
    removed = clean_stale(tmp_path / "oom")
    assert [p.name for p in removed] == [".report.html.abc.part"]
    assert open_bundle(dead).manifest["complete"]


def test_black_box_parts_and_records_are_private(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False) as mw:
        mw.step()
        bb = mw.blackbox
        assert isinstance(bb, BlackBox)
        assert mode(tmp_path / "blackbox") == 0o700 and mode(bb.path) == 0o600
        assert [p.name for p in (tmp_path / "blackbox").iterdir()] == [bb.path.name]
