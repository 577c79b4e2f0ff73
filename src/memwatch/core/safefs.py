"""Files on a shared machine: created private, never through a symlink, read with bounds.

Training runs on nodes where ``/tmp`` and project folders are writable by other users. Every
file memwatch creates goes through this module:

* **directories** are created with mode 0700 (0750 with ``share="group"``) and opened with
  ``O_NOFOLLOW``; one memwatch did not create must be owned by this user (or root) and not be
  writable by other users (unless it is sticky and this user's, like a private ``/tmp``);
* **files** are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to a directory file
  descriptor, mode 0600 (0640 with ``share="group"``), under a random temporary name, and renamed
  into place (``os.replace`` replaces a planted symlink, it never writes through it);
* **reads** of files someone else may have made (bundles, black-box records, exports) open with
  ``O_NOFOLLOW | O_NONBLOCK``, accept regular files only (a FIFO or ``/dev/zero`` is refused,
  never read) and stop at a size cap.

:func:`check_out_dir` is the check ``MemWatch.start()`` makes of its ``out_dir``.

Example::

    >>> import os
    >>> from memwatch.core.safefs import modes, open_dir, read_bounded, write_atomic
    >>> fd = open_dir(os.path.join(tmp, "out"), create=True)
    >>> write_atomic(fd, "a.json", b'{"x": 1}')
    >>> oct(os.stat(os.path.join(tmp, "out", "a.json")).st_mode & 0o777)
    '0o600'
    >>> read_bounded(os.path.join(tmp, "out", "a.json"), max_bytes=1024)
    b'{"x": 1}'
    >>> modes("group").file == 0o640
    True
    >>> os.close(fd)
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import secrets
import stat
from collections.abc import Callable
from typing import BinaryIO

from memwatch.core.errors import ConfigError, UnsafePathError

__all__ = ["PSEUDO_FS", "SHARES", "Modes", "check_dir_stat", "check_out_dir", "create_file",
           "ensure_dir", "modes", "open_append", "open_dir", "open_regular", "read_bounded",
           "write_atomic"]

log = logging.getLogger("memwatch")

#: The values of the ``share`` option: who may read what memwatch writes.
SHARES: tuple[str, ...] = ("private", "group")
#: Kernel filesystems where an ``out_dir`` can hold nothing (evidence written there is lost).
PSEUDO_FS: tuple[str, ...] = ("/proc", "/sys", "/dev")
#: Subdirectories memwatch makes in an ``out_dir``: checked at start like the ``out_dir``.
_MANAGED = ("oom", "blackbox", os.path.join("blackbox", "ended"))

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


@dataclasses.dataclass(frozen=True)
class Modes:
    """The permission bits of what memwatch creates (before the umask, which only removes)."""

    share: str
    dir: int
    file: int


def modes(share: str = "private") -> Modes:
    """The modes of ``share``: ``"private"`` (dirs 0700, files 0600: the default) or ``"group"``
    (dirs 0750, files 0640: the directory's group may read bundles and records, not write).
    Raises :class:`ConfigError` naming the option for anything else."""
    if share == "private":
        return Modes("private", 0o700, 0o600)
    if share == "group":
        return Modes("group", 0o750, 0o640)
    raise ConfigError(f"share={share!r}: use 'private' (default: only you can read what "
                      "memwatch writes) or 'group' (the directory's group may read it too).")


def _me() -> int:
    return os.geteuid()


def _private_group(gid: int) -> bool:
    """Whether group ``gid`` holds this user alone (the user-private-group convention, where a
    umask of 002 makes directories group-writable without opening them to anyone)."""
    try:
        import grp
        import pwd

        me = pwd.getpwuid(_me()).pw_name
        g = grp.getgrgid(gid)
    except (ImportError, KeyError, OSError):
        return False
    return g.gr_name == me and all(m == me for m in g.gr_mem)


def check_dir_stat(st: os.stat_result, what: str) -> None:
    """Raise :class:`UnsafePathError` unless a directory with ``st`` is safe to write into:
    owned by this user or root, and writable by no other user unless sticky and this user's."""
    me = _me()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{what} is not a directory; pass a directory")
    if st.st_uid not in (me, 0):
        raise UnsafePathError(
            f"{what} is owned by uid {st.st_uid}, not by you (uid {me}): another user could "
            "read or replace what memwatch writes there; use a directory you own, e.g. "
            "~/memwatch")
    sticky_mine = bool(st.st_mode & stat.S_ISVTX) and st.st_uid == me
    if st.st_mode & stat.S_IWOTH and not sticky_mine:
        raise UnsafePathError(
            f"{what} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"`chmod o-w` it, or use a directory only you can write, e.g. ~/memwatch")
    if st.st_mode & stat.S_IWGRP and not sticky_mine and not _private_group(st.st_gid):
        raise UnsafePathError(
            f"{what} is writable by its group (mode {stat.S_IMODE(st.st_mode):04o}), whose "
            "members could replace what memwatch writes; `chmod g-w` it, or use a directory "
            "only you can write")


def _pseudo(path: str) -> str | None:
    real = os.path.realpath(path)
    for root in PSEUDO_FS:
        if real == root or real.startswith(root + os.sep):
            return root
    return None


def check_out_dir(path: str | os.PathLike[str], share: str = "private") -> bool:
    """Check (and create, mode 0700) an ``out_dir`` before a run writes into it.

    Raises :class:`ConfigError` naming ``out_dir`` and the fix when it is not safe: under a
    kernel filesystem (``/proc``, ``/sys``, ``/dev``), a file, a symlink owned by another user,
    owned by another user, writable by other users (unless sticky and yours), or holding an
    ``oom/``/``blackbox/`` that is a symlink or someone else's. A directory that cannot be
    created (read-only filesystem, no permission) only logs a warning and returns False: the run
    goes on without bundles, as it would when writing failed later. Returns True when usable.
    """
    m = modes(share)
    raw = os.fspath(path)
    p = os.path.abspath(raw)
    pseudo = _pseudo(p)
    if pseudo is not None:
        raise ConfigError(f"out_dir={raw!r} is under {pseudo}, a kernel filesystem that keeps "
                          "nothing: the evidence of a crash would be lost; pass a directory on "
                          "disk, e.g. out_dir='memwatch'.")
    try:
        lst = os.lstat(p)
    except FileNotFoundError:
        lst = None
    except NotADirectoryError:
        raise ConfigError(f"out_dir={raw!r}: a parent of it is a file, not a directory; pass a "
                          "directory path.") from None
    except OSError as e:
        log.warning("memwatch: out_dir %s cannot be checked (%s); bundles and the black box "
                    "may not be written", raw, e)
        return False
    if lst is not None and stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (_me(), 0):
        raise ConfigError(f"out_dir={raw!r} is a symlink owned by uid {lst.st_uid}, not by you: "
                          "another user chose where memwatch would write; pass a directory "
                          "you own.")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        try:
            os.makedirs(p, mode=m.dir)
            st = os.stat(p)
        except FileExistsError:
            st = os.stat(p)
        except OSError as e:
            log.warning("memwatch: out_dir %s cannot be created (%s); no bundle or black box "
                        "will be written", raw, e)
            return False
    except NotADirectoryError:
        raise ConfigError(f"out_dir={raw!r}: a parent of it is a file, not a directory; pass a "
                          "directory path.") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"out_dir={raw!r} is a file, not a directory; pass a directory path "
                          "(it is created when missing), e.g. out_dir='memwatch'.")
    try:
        check_dir_stat(st, f"out_dir={raw!r}")
        for sub in _MANAGED:
            q = os.path.join(p, sub)
            try:
                sst = os.lstat(q)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(sst.st_mode):
                raise UnsafePathError(f"{q} is a symlink; memwatch makes that directory itself: "
                                      "remove the link")
            check_dir_stat(sst, q)
            if sst.st_uid != _me():
                raise UnsafePathError(f"{q} is owned by uid {sst.st_uid}, not by you; remove "
                                      "it or use another out_dir")
    except UnsafePathError as e:
        raise ConfigError(f"out_dir: {e}.") from None
    return True


# --------------------------------------------------------------------------- directories
def _check_fd_dir(fd: int, what: str, own: bool) -> None:
    st = os.fstat(fd)
    check_dir_stat(st, what)
    if own and st.st_uid != _me():
        raise UnsafePathError(f"{what} is owned by uid {st.st_uid}, not by you; remove it")


def open_dir(path: str | os.PathLike[str], create: bool = False, share: str = "private",
             nofollow: bool = True) -> int:
    """Open a directory memwatch writes into (created when ``create``, mode 0700/0750) and
    return its file descriptor; its last component is never a symlink when ``nofollow``, and it
    must pass :func:`check_dir_stat`. Raises :class:`UnsafePathError` (an ``OSError``)."""
    p = os.fspath(path)
    if create:
        with contextlib.suppress(FileExistsError):
            os.makedirs(p, mode=modes(share).dir)
    flags = os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC | (_O_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(p, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(p):
            raise UnsafePathError(f"{p} is a symlink; memwatch does not write through one: "
                                  "remove it") from None
        raise
    try:
        _check_fd_dir(fd, p, own=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_dir(parent_fd: int, name: str, share: str = "private") -> int:
    """The subdirectory ``name`` of ``parent_fd`` (created mode 0700/0750 when missing), opened
    without following a symlink, and owned by this user; returns its file descriptor."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, modes(share).dir, dir_fd=parent_fd)
    try:
        fd = os.open(name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC,
                     dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{name} (in an out_dir) is a symlink or a file where "
                                  "memwatch keeps a directory: remove it") from None
        raise
    try:
        _check_fd_dir(fd, name, own=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


# --------------------------------------------------------------------------- files
def create_file(dir_fd: int, name: str, share: str = "private") -> int:
    """Create ``name`` in ``dir_fd`` for writing: it must not exist (``O_EXCL``: a planted file
    or symlink makes this fail, never redirects it); returns the descriptor."""
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                   modes(share).file, dir_fd=dir_fd)


def write_atomic(dir_fd: int, name: str, data: bytes | Callable[[BinaryIO], None],
                 share: str = "private", fsync: bool = False) -> None:
    """Write ``name`` in ``dir_fd`` atomically: a fresh temporary file (``O_EXCL``, random
    name), then ``os.replace``. ``data`` is the bytes, or a function that writes to the binary
    file. A failure (a full disk) removes the temporary file and raises."""
    tmp = f".{name}.{secrets.token_hex(6)}.part"
    fd = create_file(dir_fd, tmp, share)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def open_append(path: str | os.PathLike[str], share: str = "private") -> int:
    """Open a log for appending (created mode 0600/0640) without following a symlink; it must be
    a regular file of this user's with one link. Returns the descriptor."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC
                     | _O_NONBLOCK, modes(share).file)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{p} is a symlink; memwatch does not write through one: "
                                  "remove it or pass another path") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{p} is not a regular file; pass the path of a log file")
        if st.st_uid != _me() or st.st_nlink != 1:
            raise UnsafePathError(f"{p} belongs to uid {st.st_uid} or has other names "
                                  f"({st.st_nlink} links); pass a path of your own")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str | os.PathLike[str], dir_fd: int | None = None) -> int:
    """A read-only descriptor of a regular file someone else may have made: never through a
    symlink as the last component, never blocking on a FIFO, never a device or a directory
    (:class:`UnsafePathError` says which); ``OSError`` when it cannot be opened."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{p} is a symlink (not followed)") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(f"{p} is not a regular file (not read)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: str | os.PathLike[str], max_bytes: int,
                 dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file, at most ``max_bytes`` of them, opened by
    :func:`open_regular`. Raises :class:`UnsafePathError` for a symlink, something that is not
    a regular file, or a file over the cap (the message says which), ``OSError`` when it cannot
    be read."""
    p = os.fspath(path)
    fd = open_regular(p, dir_fd)
    try:
        st = os.fstat(fd)
        if st.st_size > max_bytes:
            raise UnsafePathError(f"{p} is {st.st_size} bytes, over the {max_bytes}-byte cap "
                                  "for this file (not read)")
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise UnsafePathError(f"{p} grew past the {max_bytes}-byte cap while read")
        return data
    finally:
        os.close(fd)
