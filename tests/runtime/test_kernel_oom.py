"""Deaths without a traceback, with the real kernel: the OOM killer in a memory cgroup the test
makes (nested under this process's own, removed afterwards), and ``kill -9``.

The training loop is ``tests/oom_kill_script.py`` under ``memwatch.watch``. Where no writable
memory cgroup exists the cgroup tests skip and say why (CI's machine has one: they run there);
the ``kill -9`` tests need none.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import memwatch
from cgroup_helpers import MIB, child_cgroup_or_skip
from memwatch.bundle.blackbox import judge, read_record, summary_line
from memwatch.cli import main as cli_main
from memwatch.core.oom import classify

SCRIPT = Path(__file__).with_name("oom_kill_script.py")
SRC = Path(memwatch.__file__).resolve().parent.parent
#: Enough for the interpreter, torch and two workers; a few seconds of 8 MiB per item or step.
LIMIT = 700 * MIB

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _ls(out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert cli_main(["ls", str(out)]) == 0
    return capsys.readouterr().out


def _bundles(out: Path) -> list[dict[str, Any]]:
    docs = []
    for d in sorted((out / "oom").glob("2*")):
        docs.append({"manifest": json.loads((d / "manifest.json").read_text()),
                     "memory": json.loads((d / "memory.json").read_text()), "path": d})
    return docs


# ------------------------------------------------------------------ classification, no kernel
def test_a_killed_worker_is_host_oom_only_when_the_counter_rose() -> None:
    killed = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    gone = RuntimeError("DataLoader worker (pid(s) 4242, 4243) exited unexpectedly")
    gone.__cause__ = ConnectionRefusedError(111, "Connection refused")
    for exc in (killed, gone, EOFError(), ConnectionResetError(104, "reset by peer")):
        assert classify(exc).kind == "other"
        c = classify(exc, kernel_oom_kills=1)
        assert c.kind == "host_oom" and c.numbers["kernel_oom_kills"] == 1
    assert classify(killed, kernel_oom_kills=2).numbers["worker_pid"] == 4242
    assert classify(gone, kernel_oom_kills=1).numbers["worker_pid"] == 4242
    # Anything else stays what it was, whatever the counter says.
    assert classify(ValueError("bad batch"), kernel_oom_kills=3).kind == "other"
    assert classify(MemoryError(), kernel_oom_kills=1).kind == "host_oom"


def test_bad_blackbox_option_names_the_fix() -> None:
    with pytest.raises(ValueError, match="blackbox_every_s=0 .*or None"):
        memwatch.MemWatch(blackbox_every_s=0)


# ------------------------------------------------------------------ the kernel's OOM killer
#: Runs of the worker scenario allowed before the kernel's choice of victims counts against it.
WORKER_ATTEMPTS = 3


def test_kernel_kills_a_dataloader_worker(tmp_path: Path) -> None:
    for attempt in range(WORKER_ATTEMPTS):
        out = tmp_path / f"run{attempt}"
        with child_cgroup_or_skip(LIMIT) as cg:
            proc = cg.popen([sys.executable, str(SCRIPT), "worker", str(out)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            _, err = proc.communicate(timeout=180)
            kills = cg.oom_kills()
        assert kills >= 1, f"the kernel killed nothing; stderr: {err[-2000:]}"
        # The memory cgroup's OOM killer sometimes kills in a burst: both workers (they are its
        # first choice, oom_score_adj 1000), then the main process, within ~10 ms, before the
        # workers' pages are uncharged (seen in the kernel log, 1 run in 6 here). Such a run
        # never reaches the DataLoader's error, so it tests nothing of memwatch's: run again.
        if proc.returncode != -signal.SIGKILL or kills < 3:
            break
    assert proc.returncode == 1, err[-2000:]  # the loop failed with the DataLoader's error
    oom = [b for b in _bundles(out) if b["manifest"]["trigger"] == "exception"]
    assert len(oom) == 1, err[-2000:]
    b = oom[0]
    assert b["manifest"]["classification"] == "host_oom"
    exc = json.loads((b["path"] / "exception.json").read_text())
    assert exc["numbers"]["kernel_oom_kills"] >= 1
    cgroup = b["memory"]["cgroup"]
    assert cgroup["limit"] == LIMIT and cgroup["oom_kills_now"] > cgroup["oom_kills_at_start"]
    worker = cgroup["killed_worker"]
    assert worker["pid"] == exc["numbers"]["worker_pid"] and worker["uss"] > 32 * MIB
    latest = b["memory"]["latest"]
    assert latest["cgroup.working_set"] > 0.5 * LIMIT
    # The run closed (with its bundle): no black-box record is left behind.
    assert not list((out / "blackbox").glob("*.json"))


def test_kernel_kills_the_training_process(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    with child_cgroup_or_skip(LIMIT) as cg:
        proc = cg.popen([sys.executable, str(SCRIPT), "main", str(out)], env=_env(),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, err = proc.communicate(timeout=180)
        assert proc.returncode == -signal.SIGKILL, err[-2000:]
        assert cg.oom_kills() >= 1
        # While the job's cgroup still exists (a container's does), ls confirms the cause.
        text = _ls(out, capsys)
        last_step = int(stdout.split()[-1])
        assert "killed by the kernel's OOM killer at step" in text, text
        records = list((out / "blackbox").glob("*.json"))
        assert len(records) == 1
        doc = read_record(records[0])
        assert 0 < doc["step"] <= last_step + 1  # (killed between mw.step() and its print)
        assert doc["cgroup"]["oom_kills_at_start"] == 0
        # The watchdog acted before the kernel did: a bundle at its critical threshold.
        crit = [b for b in _bundles(out) if b["manifest"]["trigger"] == "watchdog"]
        assert crit and "critical" in crit[0]["manifest"]["reason"]
        # A new run in the same out_dir reports the unclean end once.
        with memwatch.watch(device="cpu", workers=False, out_dir=str(out)) as mw:
            assert [r["end"]["oom_killed"] for r in mw.previous_unclean] == [True]
    with memwatch.watch(device="cpu", workers=False, out_dir=str(out)) as mw2:
        assert mw2.previous_unclean == []
    assert "killed by the kernel's OOM killer" in _ls(out, capsys)  # kept under ended/


# ------------------------------------------------------------------ kill -9, no cgroup
def test_kill_9_leaves_a_black_box(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "plain", str(out)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(40)]  # ready, then 39 steps
    assert lines[0].strip() == "ready"
    time.sleep(1.0)  # at least one rewrite after those steps (every 0.3 s)
    rec = out / "blackbox"
    (live,) = list(rec.glob("*.json"))
    assert judge(read_record(live))["state"] == "running"
    assert "running at step" in _ls(out, capsys)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    doc = read_record(live)
    end = judge(doc)
    assert end["state"] == "unclean" and doc["step"] >= 39
    text = _ls(out, capsys)
    assert f"at step {doc['step']}" in text
    assert "ended without a clean close" in text
    assert summary_line(doc, end) in text
    capsys.readouterr()
    assert cli_main(["inspect", str(live)]) == 0
    story = capsys.readouterr().out
    assert f"step {doc['step']}" in story and "host.rss" in story
    with memwatch.watch(device="cpu", workers=False, out_dir=str(out)) as mw:
        (prev,) = mw.previous_unclean
        assert prev["pid"] == proc.pid and prev["end"]["state"] == "unclean"
    assert not list(rec.glob("*.json"))  # moved to ended/, reported once
    assert len(list((rec / "ended").glob("*.json"))) == 1


def test_clean_close_leaves_no_record(tmp_path: Path) -> None:
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path), interval_s=0.05,
                        blackbox_every_s=0.05) as mw:
        assert mw.blackbox is not None
        # Steps until the black box was rewritten twice (counted; the bound only stops a hung
        # writer from hanging the suite): 20 steps 10 ms apart saw one write on a loaded machine.
        end = time.monotonic() + 120
        while mw.blackbox.writes < 2:
            assert time.monotonic() < end, f"{mw.blackbox.writes} black-box writes"
            mw.step()
            time.sleep(0.01)
        assert mw.blackbox.path.is_file()
    assert not list((tmp_path / "blackbox").glob("*"))
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path),
                        blackbox_every_s=None) as mw:
        assert mw.blackbox is None
