"""Hostile bundles and records given to ``memwatch inspect``, ``report`` and ``ls``: one line and
exit code 2 (or a clean rendering), never a traceback, never a file outside the bundle, never a
terminal escape, bounded time and memory; one bad bundle never hides the others."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostile_bundles import MARK, MUTATIONS, real_bundle
from memwatch.cli import main

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_bundle(tmp_path_factory.mktemp("hostile"))


def fresh(good: Path, tmp_path: Path, name: str = "out") -> Path:
    dst = tmp_path / name / "oom" / good.name
    shutil.copytree(good, dst)
    return dst


def controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("label", sorted(MUTATIONS))
def test_hostile_bundle(label: str, good: Path, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    mutate, refused = MUTATIONS[label]
    b = fresh(good, tmp_path)
    mutate(b)
    Path("/tmp/memwatch-test-pwned").unlink(missing_ok=True)
    t0 = time.monotonic()
    for args in (["inspect", str(b)], ["report", str(b), "-o", str(tmp_path / "r.html")]):
        rc, out, err = run(args, capsys)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if refused or rc != 0:
            assert rc == 2, (args[0], rc, err)
            assert len(lines) == 1 and lines[0].startswith(f"memwatch {args[0]}: error:"), err
        assert MARK not in out + err and not controls(out + err), (args[0], out[-300:])
    if (tmp_path / "r.html").exists():
        assert MARK not in (tmp_path / "r.html").read_text()
    assert time.monotonic() - t0 < 20
    assert not Path("/tmp/memwatch-test-pwned").exists()
    # ls of the folder: the hostile bundle is one line among the others, never a traceback.
    other = fresh(good, tmp_path, "out2")
    shutil.copytree(other, b.parent / (other.name + "-2"))
    rc, out, err = run(["ls", str(tmp_path / "out")], capsys)
    assert rc == 0 and f"{other.name}-2" in out and not controls(out), err


def _dead_record(out: Path, **extra: object) -> Path:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    bb = out / "blackbox"
    bb.mkdir(parents=True, exist_ok=True)
    doc = {"schema": 1, "kind": "memwatch-blackbox", "host": socket.gethostname(),
           "pid": dead.pid, "proc_start": 1,
           "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
           "started_unix": 1.0, "updated_unix": 2.0, "step": 3, "epoch": 0, "latest": {},
           "cgroup": None, "findings": [], "samples": [], **extra}
    p = bb / f"{socket.gethostname()}-pid{dead.pid}.json"
    p.write_text(json.dumps(doc))
    return p


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "memwatch.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_a_record_pointing_at_a_fifo_or_dev_zero_is_never_read(tmp_path: Path) -> None:
    """Only regular files under /sys/fs/cgroup are opened: ``ls``, ``inspect FILE`` and the
    next run's start finish at once (they read forever before)."""
    fifo_cg, zero_cg = tmp_path / "fifocg", tmp_path / "zerocg"
    fifo_cg.mkdir()
    os.mkfifo(fifo_cg / "memory.events")
    zero_cg.mkdir()
    (zero_cg / "memory.events").symlink_to("/dev/zero")
    out = tmp_path / "out"
    recs = [_dead_record(out, cgroup={"path": str(cg), "version": 2, "oom_kills": 0})
            for cg in (fifo_cg, zero_cg)]
    # Even a path that looks right but walks out of /sys/fs/cgroup is not opened.
    recs.append(_dead_record(out, cgroup={"path": f"/sys/fs/cgroup/../../{zero_cg}",
                                          "version": 2, "oom_kills": 0}))
    os.mkfifo(out / "blackbox" / "fifo-pid1.json")  # a record that is itself a FIFO
    t0 = time.monotonic()
    r = _cli("ls", str(out))
    assert r.returncode == 0 and r.stdout.count("ended without a clean close") == 3, r.stderr
    r = _cli("inspect", str(recs[0]))
    assert r.returncode == 0 and "no OOM-kill evidence" in r.stdout, r.stderr
    start = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(SRC)!r}); import memwatch\n"
         f"with memwatch.watch(device='cpu', workers=False, out_dir={str(out)!r},"
         " signals=False) as mw: mw.step()\nprint('started')"],
        capture_output=True, text=True, timeout=30)
    assert "started" in start.stdout, start.stderr
    assert time.monotonic() - t0 < 25


def test_hostile_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    bad = _dead_record(out, samples={"a": 1}, latest=[1], findings="x")
    deep = out / "blackbox" / f"{socket.gethostname()}-pid4.json"
    deep.write_text('{"kind": "memwatch-blackbox", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    escaped = _dead_record(out, host=socket.gethostname(), step=7, findings=[{
        "kind": "leak", "metric": "host.rss", "severity": "warning",
        "message": "\x1b]0;pwned\x07\x1b[2Jcleared"}])
    rc, stdout, err = run(["inspect", str(bad)], capsys)
    assert rc == 2 and err.count("\n") == 1 and "not a memwatch black-box record" in err
    rc, stdout, err = run(["inspect", str(deep)], capsys)
    assert rc == 2 and "nested deeper" in err
    rc, stdout, err = run(["inspect", str(escaped)], capsys)
    assert rc == 0 and "cleared" in stdout and not controls(stdout)
    rc, stdout, err = run(["ls", str(out)], capsys)
    assert rc == 0 and stdout.count("ended without a clean close") == 1  # the readable one


def test_names_with_terminal_escapes_are_printed_harmless(good: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    b = fresh(good, tmp_path)
    evil = b.with_name(b.name + "\x1b]0;pwned\x07\x1b[2J")
    b.rename(evil)
    rc, out, err = run(["ls", str(tmp_path / "out")], capsys)
    assert rc == 0 and "pwned" in out and not controls(out)
    rc, out, err = run(["inspect", str(evil)], capsys)
    assert rc == 0 and not controls(out + err)
    (evil / "manifest.json").write_text("{")
    rc, out, err = run(["inspect", str(evil)], capsys)
    assert rc == 2 and not controls(err) and err.count("\n") == 1


def test_a_huge_timeline_is_read_from_its_end_in_bounded_time(good: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    b = fresh(good, tmp_path)
    lines = (b / "timeline.jsonl").read_text().splitlines()
    header, samples = lines[0], [ln for ln in lines if '"type": "sample"' in ln]
    with open(b / "timeline.jsonl", "w") as f:
        f.write(header + "\n")
        n = 0
        while f.tell() < 40 * (1 << 20):  # 40 MiB: over the 16 MiB the reader takes
            f.write(samples[n % len(samples)] + "\n")
            n += 1
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["timeline.jsonl"] = (b / "timeline.jsonl").stat().st_size
    (b / "manifest.json").write_text(json.dumps(m))
    t0 = time.monotonic()
    rc, out, err = run(["inspect", str(b)], capsys)
    assert rc == 0, err
    assert time.monotonic() - t0 < 30


def test_report_output_at_a_planted_symlink_replaces_the_link(good: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "report.html"
    link.symlink_to(victim)
    rc, out, err = run(["report", str(good), "-o", str(link)], capsys)
    assert rc == 0, err
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and link.read_text().startswith("<!DOCTYPE html>")
    assert os.stat(link).st_mode & 0o077 == 0  # private, like everything memwatch writes
