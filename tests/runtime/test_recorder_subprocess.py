"""Flight recorder acceptance tests in real child processes: where isolation is the point (an
address-space limit, kill -9, signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import memwatch
from memwatch.bundle import TMP_PREFIX, Bundle, find_bundles, open_bundle
from memwatch.cli import main as cli_main
from memwatch.core.errors import BundleError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="RLIMIT_AS, /proc and POSIX signals: Linux")

HOST_OOM_CHILD = textwrap.dedent("""
    import resource, sys
    import torch
    import memwatch

    torch.set_num_threads(1)
    with open("/proc/self/status") as f:
        vmsize = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=sys.argv[1]).start()
    # Set after importing torch and starting memwatch: only the training can hit the limit.
    limit = vmsize + 320 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    kept = []  # the bug: every step keeps an 8 MiB activation
    for step in range(10_000):
        x = torch.randn(32, 128)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        kept.append(torch.ones(2 * 2**20))
        mw.step()
        if step % 10 == 9:
            mw.end_epoch()
""")

SLOW_WRITER_CHILD = textwrap.dedent("""
    import sys
    import memwatch

    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=sys.argv[1]).start()
    for _ in range(20):
        mw.step()
    mw.dump("slow write")  # MEMWATCH_TEST_BUNDLE_PAUSE_S makes it pause between files
""")

SIGNAL_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    import memwatch

    out, marker, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "custom":
        def previous(signum, frame):
            with open(marker, "w") as f:
                f.write("previous SIGTERM handler ran")
            sys.exit(0)
        signal.signal(signal.SIGTERM, previous)
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=out).start()
    open(os.path.join(out, "ready"), "w").close()
    steps = 0
    while True:
        mw.step()
        steps += 1
        ping = os.path.join(out, "ping")
        if os.path.exists(ping):
            os.remove(ping)
            with open(os.path.join(out, "pong"), "w") as f:
                f.write(str(steps))
        time.sleep(0.005)
""")


def _child(tmp: Path, code: str, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.Popen[bytes]:
    script = tmp / "child.py"
    script.write_text(code)
    full_env = {**os.environ, **(env or {})}
    # Output goes to a file (the child keeps its own descriptor): no pipe can fill up or leak.
    with open(tmp / "child.log", "wb") as log:
        return subprocess.Popen([sys.executable, str(script), *args], stdout=log,
                                stderr=subprocess.STDOUT, env=full_env)


def _wait_for(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def _complete(out: Path) -> list[Bundle]:
    root = out / "oom"
    if not root.is_dir():
        return []
    return [b for _, b in find_bundles(root) if isinstance(b, Bundle)]


def test_real_training_loop_dying_of_host_oom_leaves_exactly_one_bundle(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _child(tmp_path, HOST_OOM_CHILD, str(out))
    proc.wait(timeout=120)
    stderr = (tmp_path / "child.log").read_text()
    assert proc.returncode == 1, stderr
    # The original exception reaches the user unchanged, with a note naming the bundle.
    assert "DefaultCPUAllocator: can't allocate memory" in stderr
    assert "memwatch: diagnostic bundle written to" in stderr
    (b,) = _complete(out)
    # One line for one bundle (the note under the traceback, no log line above it), and the
    # command it prints runs as printed.
    lines = [ln for ln in stderr.splitlines() if b.path.name in ln]
    assert len(lines) == 1 and "exception bundle written" not in stderr, stderr
    cmd = lines[0].split("(look inside: ", 1)[1].removesuffix(")")
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "The host ran out of memory" in r.stdout, (cmd, r.stderr)
    assert [p.name for p in (out / "oom").iterdir()] == [b.path.name]  # no leftovers either
    m = b.manifest
    assert m["classification"] == "host_oom" and m["trigger"] == "exception"
    exc = b.read_json("exception.json")
    assert exc["numbers"]["tried_to_allocate"] == 8 * 2**20
    mem = b.read_json("memory.json")
    aspace = mem["address_space"]
    assert aspace["vmsize"] / aspace["rlimit_as"] > 0.9
    census = b.read_json("census.json")
    assert "error" not in census, census  # even at the limit, the census was taken
    # The kept activations are the largest group. How many fit in the 320 MiB of address space
    # varies: 30 without memwatch, 19 to 21 with it (its thread and analysis take address space
    # too); at least a third of the headroom is theirs either way.
    assert census["groups"][0]["shape"] == [2 * 2**20] and census["groups"][0]["count"] >= 12
    samples = [r for r in b.timeline() if r["type"] == "sample"]
    assert len(samples) >= m["step"] >= 12  # every step it trained is in the timeline
    assert m["write_seconds"] < 5.0
    assert cli_main(["inspect", str(b.path)]) == 0


def test_kill_9_mid_write_leaves_no_complete_looking_bundle(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    out = tmp_path / "out"
    proc = _child(tmp_path, SLOW_WRITER_CHILD, str(out),
                  env={"MEMWATCH_TEST_BUNDLE_PAUSE_S": "30"})
    root = out / "oom"

    def partially_written() -> bool:
        tmps = [p for p in root.glob(f"{TMP_PREFIX}*")] if root.is_dir() else []
        return bool(tmps) and len(list(tmps[0].iterdir())) >= 1

    try:
        _wait_for(partially_written)
        time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    (leftover,) = list(root.iterdir())
    assert leftover.name.startswith(TMP_PREFIX)
    assert not (leftover / "manifest.json").exists()
    assert _complete(out) == []
    with pytest.raises(BundleError, match="incomplete"):
        open_bundle(leftover)
    assert cli_main(["inspect", str(leftover)]) == 2
    assert "incomplete" in capsys.readouterr().err
    # The next start cleans it (its writer's pid is dead).
    with memwatch.watch(device="cpu", workers=False, out_dir=out, signals=False):
        pass
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("mode", ["custom", "default"])
def test_signals_write_bundles_then_go_to_the_previous_handler(tmp_path: Path, mode: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    marker = tmp_path / "marker"
    proc = _child(tmp_path, SIGNAL_CHILD, str(out), str(marker), mode)
    try:
        _wait_for(lambda: (out / "ready").exists())
        if mode == "custom":
            proc.send_signal(signal.SIGUSR1)
            _wait_for(lambda: len(_complete(out)) == 1)
            # The child carries on training after SIGUSR1.
            (out / "ping").touch()
            _wait_for(lambda: (out / "pong").exists())
            assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    bundles = _complete(out)
    reasons = sorted(b.manifest["reason"] for b in bundles)
    assert all(b.manifest["trigger"] == "signal" for b in bundles)
    if mode == "custom":
        assert proc.returncode == 0  # the program's own SIGTERM handler decided how to exit
        assert marker.read_text() == "previous SIGTERM handler ran"
        assert reasons == ["received SIGTERM", "received SIGUSR1"]
    else:
        assert proc.returncode == -signal.SIGTERM  # the default action still happens
        assert reasons == ["received SIGTERM"]
