"""Safe files on a shared machine (core/safefs, core/untrusted, core/safepickle's bounds):
real files, real symlinks, real FIFOs and devices, a real read-only filesystem where root can
mount one."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import memwatch
from memwatch.core import safepickle
from memwatch.core.errors import ConfigError, UnsafePathError, UnsafePickleError
from memwatch.core.safefs import (
    check_out_dir,
    create_file,
    ensure_dir,
    modes,
    open_append,
    open_dir,
    read_bounded,
    write_atomic,
)
from memwatch.core.untrusted import check_depth, loads_json, printable, sanitize

VICTIM = "the victim's file\n"


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_text(VICTIM)
    return v


# ---------------------------------------------------------------- modes and out_dir
def test_modes_name_the_option() -> None:
    assert (modes().dir, modes().file) == (0o700, 0o600)
    assert (modes("group").dir, modes("group").file) == (0o750, 0o640)
    with pytest.raises(ConfigError, match=r"share='world'.*'private'.*'group'"):
        modes("world")


def test_out_dir_is_created_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        assert check_out_dir(tmp_path / "a" / "memwatch") is True
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "memwatch") == 0o700


def test_out_dir_refusals_name_the_fix(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        check_out_dir(f)
    with pytest.raises(ConfigError, match="a parent of it is a file"):
        check_out_dir(f / "sub")
    with pytest.raises(ConfigError, match="under /proc, a kernel filesystem"):
        check_out_dir("/proc/self/memwatch")
    with pytest.raises(ConfigError, match="under /sys"):
        check_out_dir("/sys/memwatch")
    world = tmp_path / "world"
    world.mkdir()
    os.chmod(world, 0o777)
    with pytest.raises(ConfigError, match=r"writable by every user .*chmod o-w"):
        check_out_dir(world)
    os.chmod(world, 0o1777)  # sticky and mine: others cannot replace what I create
    assert check_out_dir(world) is True
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "oom").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="oom is a symlink"):
        check_out_dir(mine)
    (mine / "oom").unlink()
    (mine / "oom").mkdir(mode=0o777)
    os.chmod(mine / "oom", 0o777)
    with pytest.raises(ConfigError, match="writable by every user"):
        check_out_dir(mine)


def test_memwatch_start_refuses_an_unsafe_out_dir(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(ConfigError, match="out_dir=.*exists and is not a directory"):
        memwatch.MemWatch(device="cpu", workers=False, out_dir=f, signals=False)  # at once
    world = tmp_path / "world"
    world.mkdir()
    os.chmod(world, 0o777)
    with pytest.raises(ConfigError, match="writable by every user"):
        memwatch.MemWatch(device="cpu", workers=False, out_dir=world, signals=False).start()
    assert not list(world.iterdir())  # nothing was written into it


@contextlib.contextmanager
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody can create anything in: a read-only tmpfs as root (root ignores
    modes), a mode 0500 directory otherwise."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k,mode=0755", "tmpfs",
                            str(d)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {r.stderr.strip()}")
        try:
            yield d
        finally:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
    else:
        os.chmod(d, 0o500)
        try:
            yield d
        finally:
            os.chmod(d, 0o700)


def test_read_only_out_dir_only_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with read_only_dir(tmp_path) as ro, caplog.at_level(logging.WARNING, logger="memwatch"):
        assert check_out_dir(ro / "memwatch") is False
        assert "cannot be created" in caplog.text
        with memwatch.watch(device="cpu", workers=False, out_dir=ro / "memwatch",
                            signals=False) as mw:
            mw.step()
            assert mw.dump("a look") is None  # no bundle, no exception
        assert "bundle not written" in caplog.text


# ---------------------------------------------------------------- writing
def test_write_atomic_replaces_a_planted_symlink_never_writes_through_it(
        tmp_path: Path, victim: Path) -> None:
    fd = open_dir(tmp_path / "out", create=True)
    try:
        (tmp_path / "out" / "record.json").symlink_to(victim)
        write_atomic(fd, "record.json", b"{}")
        assert victim.read_text() == VICTIM
        assert not (tmp_path / "out" / "record.json").is_symlink()
        assert mode(tmp_path / "out" / "record.json") == 0o600

        def fails(f: object) -> None:
            raise OSError(28, "No space left on device")

        with pytest.raises(OSError, match="No space"):
            write_atomic(fd, "other.json", fails)
        assert sorted(os.listdir(fd)) == ["record.json"]  # no .part left behind
    finally:
        os.close(fd)


def test_create_file_and_dirs_never_follow_symlinks(tmp_path: Path, victim: Path) -> None:
    fd = open_dir(tmp_path / "out", create=True)
    try:
        os.symlink(victim, "planted", dir_fd=fd)
        with pytest.raises(FileExistsError):
            create_file(fd, "planted")
        os.symlink(tmp_path, "sub", dir_fd=fd)
        with pytest.raises(UnsafePathError, match="symlink"):
            ensure_dir(fd, "sub")
        sub = ensure_dir(fd, "fresh", share="group")
        os.close(sub)
        assert mode(tmp_path / "out" / "fresh") == 0o750
    finally:
        os.close(fd)
    assert victim.read_text() == VICTIM
    (tmp_path / "link").symlink_to(tmp_path / "out")
    with pytest.raises(UnsafePathError, match="is a symlink"):
        open_dir(tmp_path / "link")


def test_open_append_refuses_links_and_fifos(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "sym.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symlink"):
        open_append(tmp_path / "sym.jsonl")
    os.link(victim, tmp_path / "hard.jsonl")
    with pytest.raises(UnsafePathError, match="2 links"):
        open_append(tmp_path / "hard.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(OSError):  # ENXIO (no reader) or "not a regular file": never blocks
        open_append(tmp_path / "fifo.jsonl")
    assert victim.read_text() == VICTIM
    fd = open_append(tmp_path / "ok.jsonl")
    os.close(fd)
    assert mode(tmp_path / "ok.jsonl") == 0o600


# ---------------------------------------------------------------- reading
def test_read_bounded_refuses_what_is_not_a_small_regular_file(tmp_path: Path,
                                                               victim: Path) -> None:
    (tmp_path / "sym").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symlink"):
        read_bounded(tmp_path / "sym", 1024)
    os.mkfifo(tmp_path / "fifo")
    t0 = time.monotonic()
    with pytest.raises(UnsafePathError, match="not a regular file"):
        read_bounded(tmp_path / "fifo", 1024)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        read_bounded("/dev/zero", 1024)
    assert time.monotonic() - t0 < 1.0
    (tmp_path / "big").write_bytes(b"x" * 2048)
    with pytest.raises(UnsafePathError, match="over the 1024-byte cap"):
        read_bounded(tmp_path / "big", 1024)
    assert read_bounded(victim, 1024) == VICTIM.encode()


def test_untrusted_json_and_text() -> None:
    with pytest.raises(ValueError, match="nested deeper"):
        loads_json(b"[" * 100_000 + b"]" * 100_000, "deep.json")
    with pytest.raises(ValueError, match="not UTF-8"):
        loads_json(b'{"a": "\xff"}', "bad.json")
    with pytest.raises(ValueError, match="not valid JSON"):
        loads_json(b'{"a": ', "cut.json")
    assert check_depth([[[1]]], 3) and not check_depth([[[[1]]]], 3)
    assert printable("ok\tline\n\x1b]0;title\x07\x9b2J\u202eevil") == \
        "ok\tline\n?]0;title??2J?evil"
    doc = sanitize({"msg\x1b": "x" * 100, "n": [1, {"s": "\x07"}]}, max_str=10)
    assert doc == {"msg?": "x" * 10 + "...(cut)", "n": [1, {"s": "?"}]}


def test_safepickle_refuses_a_small_pickle_that_expands(tmp_path: Path) -> None:
    blocks = [{"size": 512, "state": "active_allocated"}] * 3000
    seg = {"total_size": 1 << 20, "blocks": blocks}
    data = pickle.dumps({"segments": [seg] * 3000}, protocol=4)
    assert len(data) < 64 * 1024
    t0 = time.monotonic()
    with pytest.raises(UnsafePickleError, match="more than once"):
        safepickle.loads(data)
    assert time.monotonic() - t0 < 1.0
    nested: list[object] = []
    cur = nested
    for _ in range(200):
        nxt: list[object] = []
        cur.append(nxt)
        cur = nxt
    with pytest.raises(UnsafePickleError, match="nests deeper"):
        safepickle.loads(pickle.dumps(nested))
    real = {"segments": [{"total_size": 2, "blocks": [{"size": 1, "frames": ()},
                                                      {"size": 1, "frames": ()}]}]}
    assert safepickle.loads(pickle.dumps(real)) == real  # shared () singletons are fine
    (tmp_path / "s.pickle").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafePickleError, match="symlink"):
        safepickle.load(tmp_path / "s.pickle")
