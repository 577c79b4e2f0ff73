"""A real second user on the machine (``useradd``; root only): what an attacker can plant, and
what a colleague can read. The victim is this test process; the attacker's steps run in a
forked child that dropped to the other user (``tests/second_user.py``)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import memwatch
from memwatch.bundle import BundleWriter
from memwatch.sinks import JsonlSink
from second_user import User, as_user

VICTIM = "the victim's file\n"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may create entries in, like /tmp (sticky, world-writable)."""
    d = Path(tempfile.mkdtemp(prefix="mw-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def victim_file(shared: Path) -> Path:
    v = shared / "victim-private.txt"
    v.write_text(VICTIM)
    os.chmod(v, 0o600)
    return v


def test_an_out_dir_another_user_made_first_is_refused(other_user: User, shared: Path,
                                                       victim_file: Path) -> None:
    """The default ./memwatch of a job started from a shared folder: the attacker makes it
    first (mode 0777, and a symlink inside where the black box goes)."""
    out = shared / "memwatch"

    def plant() -> None:
        out.mkdir()
        os.chmod(out, 0o777)
        (out / "blackbox").symlink_to(victim_file.parent)

    assert as_user(other_user, plant)["ok"]
    with pytest.raises(memwatch.ConfigError, match=f"owned by uid {other_user.uid}"):
        memwatch.MemWatch(device="cpu", workers=False, out_dir=out, signals=False).start()
    assert victim_file.read_text() == VICTIM
    assert sorted(p.name for p in shared.iterdir()) == ["memwatch", "victim-private.txt"]


def test_an_out_dir_symlink_another_user_planted_is_refused(other_user: User,
                                                            shared: Path) -> None:
    target = shared / "victim-dir"
    target.mkdir()  # the victim's own directory: the attacker picks where the run writes

    def plant() -> None:
        (shared / "memwatch").symlink_to(target)

    assert as_user(other_user, plant)["ok"]
    with pytest.raises(memwatch.ConfigError, match="symlink owned by uid"):
        memwatch.MemWatch(device="cpu", workers=False, out_dir=shared / "memwatch",
                          signals=False).start()
    assert list(target.iterdir()) == []


def test_a_blackbox_folder_another_user_made_is_refused(other_user: User,
                                                        shared: Path) -> None:
    """An out_dir of the victim's that is sticky and world-writable (allowed: others cannot
    replace what the victim creates) still cannot hold the attacker's ``blackbox/``."""
    out = shared / "out"
    out.mkdir()
    os.chmod(out, 0o1777)
    assert as_user(other_user, lambda: (out / "blackbox").mkdir(mode=0o777))["ok"]
    with pytest.raises(memwatch.ConfigError, match="blackbox is owned by uid"):
        memwatch.MemWatch(device="cpu", workers=False, out_dir=out, signals=False).start()


def test_a_log_symlink_planted_after_the_check_is_not_written_through(
        other_user: User, shared: Path, victim_file: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    logs = shared / "logs"
    logs.mkdir()
    os.chmod(logs, 0o1777)  # sticky and the victim's: allowed
    sink = JsonlSink(logs / "events.jsonl")
    assert as_user(other_user, lambda: (logs / "events.jsonl").symlink_to(victim_file))["ok"]
    with caplog.at_level(logging.WARNING, logger="memwatch"), memwatch.watch(
            device="cpu", workers=False, out_dir=shared / "run", signals=False,
            sinks=[sink], log_every_n_steps=1) as mw:
        mw.step()
        mw.step()
    assert victim_file.read_text() == VICTIM
    # O_NOFOLLOW refuses the link (ELOOP; EACCES from the kernel's sticky-folder rules for a
    # link another user owns): the sink is disabled with one warning, the run goes on.
    assert "sink JsonlSink disabled" in caplog.text


def test_another_user_reads_nothing_of_a_run(other_user: User, shared: Path) -> None:
    out = shared / "run"
    os.umask(old := os.umask(0o022))
    try:
        sink = JsonlSink(out / "events.jsonl")
        with memwatch.watch(device="cpu", workers=False, out_dir=out, signals=False,
                            sinks=[sink], log_every_n_steps=1) as mw:
            mw.step()
            bundle = mw.dump("look")
            assert bundle is not None and mw.blackbox is not None
            record = mw.blackbox.path
            for target in (out, bundle, record, bundle / "environment.json",
                           bundle / "exception.json" if (bundle / "exception.json").exists()
                           else bundle / "memory.json", out / "events.jsonl"):
                res = as_user(other_user, lambda t=target: (
                    os.listdir(t) if t.is_dir() else t.read_bytes()[:10]))
                assert not res["ok"] and "PermissionError" in res["error"], (target, res)
    finally:
        os.umask(old)


def test_group_share_lets_the_group_read_not_write(other_user: User, shared: Path) -> None:
    team = shared / "team"
    team.mkdir()
    os.chown(team, 0, other_user.gid)
    os.chmod(team, 0o2750)  # setgid: what is made inside belongs to the team's group
    w = BundleWriter(team / "oom", "b1", share="group")
    for f in ("environment.json", "findings.json", "memory.json"):
        w.write_json(f, {"x": 1})
    p = w.commit({"trigger": "manual"})
    read = as_user(other_user, lambda: (p / "memory.json").read_text())
    assert read["ok"] and '"x": 1' in read["value"]
    for attack in (lambda: (p / "planted").symlink_to("/etc/passwd"),
                   lambda: (p / "memory.json").write_text("{}"),
                   lambda: os.rename(p, team / "oom" / "elsewhere")):
        res = as_user(other_user, attack)
        assert not res["ok"] and "PermissionError" in res["error"]
    assert stat.S_IMODE(os.stat(p / "memory.json").st_mode) == 0o640
