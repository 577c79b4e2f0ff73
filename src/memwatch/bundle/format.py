"""The OOM bundle on disk: safe, atomic writing (reading is :mod:`.reader`, retention
:mod:`.retention`).

A bundle is a directory ``<out_dir>/oom/<UTC time>-<host>-rank<r>-pid<p>/``. It is built under a
hidden temporary name (``.tmp-<host>-<pid>-<random>``) and renamed into place only after its
``manifest.json`` (written last, ``"complete": true``) lists every file with its size, so a crash
or ``kill -9`` mid-write can never leave a directory that looks like a finished bundle; temporary
directories of dead writers are removed by :func:`clean_stale` at the next start.

Files (schema version 1; see ``docs/flight-recorder.md``):

==================  =========  ==============================================================
file                required   content
==================  =========  ==============================================================
manifest.json       yes        schema, memwatch version, trigger, classification, files/sizes
exception.json      with exc   type, message, parsed OOM figures, traceback text
environment.json    yes        Python, platform, torch/CUDA, device, relevant env (redacted)
findings.json       yes        the analyzer's findings so far
memory.json         yes        latest sample and known limits at the failure
timeline.jsonl      optional   recent raw samples and per-epoch summaries, one JSON per line
census.json         optional   largest live tensors and their holders
allocator.json      optional   allocator statistics and a segment summary (device runs)
ranks.json          optional   rank 0 of a distributed run: every rank's last epoch-end summary
snapshot.pickle     optional   allocator snapshot (plain containers; read with safepickle)
report.html         optional   self-contained offline report (added after the commit)
==================  =========  ==============================================================

The bundle's directories are private (mode 0700) and its files too (0600), or readable by the
directory's group with ``share="group"`` (0750/0640); nothing is ever written through a symlink
(see :class:`BundleWriter` and ``docs/security.md``).

``report.html`` is only a rendering of the other files, and rendering it takes memory and time a
dying process may not have: it is added to the committed bundle by :func:`add_file` (the manifest
rewritten atomically), so a kill while it renders leaves a complete bundle without it.

Example::

    >>> from memwatch.bundle import BundleWriter, open_bundle
    >>> import os, stat
    >>> w = BundleWriter(os.path.join(tmp, "oom"), "20260101T000000Z-host-rank0-pid1")
    >>> w.write_json("environment.json", {"python": "3.11"})
    >>> w.write_json("findings.json", [])
    >>> w.write_json("memory.json", {"latest": {}, "limits": {}})
    >>> path = w.commit({"trigger": "manual", "classification": None})
    >>> open_bundle(path).manifest["complete"]
    True
    >>> mode = lambda p: oct(stat.S_IMODE(os.stat(p).st_mode))
    >>> mode(path), mode(path / "memory.json")
    ('0o700', '0o600')
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memwatch._version import __version__
from memwatch.core.errors import BundleError
from memwatch.core.jsonable import finite
from memwatch.core.safefs import (
    create_file,
    ensure_dir,
    modes,
    open_dir,
    read_bounded,
    write_atomic,
)

__all__ = [
    "BUNDLE_SUBDIRS",
    "END_OF_RUN_SUBDIR",
    "OOM_SUBDIR",
    "OPTIONAL_FILES",
    "REQUIRED_FILES",
    "SCHEMA_VERSION",
    "TMP_PREFIX",
    "add_file",
    "BundleWriter",
    "bundle_name",
    "dir_size",
    "host_name",
    "note_error",
]

SCHEMA_VERSION = 1
#: Bundles of failures (an OOM, an exception, a signal, the watchdog, ``mw.dump()``).
OOM_SUBDIR = "oom"
#: Bundles written at a clean end because a sink asked for one (W&B's report and snapshot):
#: not failures, so not among them.
END_OF_RUN_SUBDIR = "end_of_run"
#: The folders of an ``out_dir`` that hold bundles.
BUNDLE_SUBDIRS = (OOM_SUBDIR, END_OF_RUN_SUBDIR)
TMP_PREFIX = ".tmp-"
REQUIRED_FILES: tuple[str, ...] = ("manifest.json", "environment.json", "findings.json",
                                   "memory.json")
OPTIONAL_FILES: tuple[str, ...] = ("snapshot.pickle", "census.json", "timeline.jsonl",
                                   "allocator.json", "ranks.json", "report.html")
# Test hook: seconds to sleep between files, so a test can SIGKILL a writer mid-bundle.
_PAUSE_ENV = "MEMWATCH_TEST_BUNDLE_PAUSE_S"


def _json_default(o: Any) -> Any:
    # numpy scalars, sets, paths: anything JSON cannot take becomes a plain value or its repr.
    if hasattr(o, "item") and callable(o.item):
        try:
            return o.item()
        except Exception:  # noqa: BLE001
            pass
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    return repr(o)


def bundle_name(wall: float, rank: int, pid: int) -> str:
    """A bundle's directory name: ``<UTC time>-<host>-rank<r>-pid<p>``. The time comes first, so
    names sort oldest first across the folders of several ranks and nodes; milliseconds keep
    them unique and in order when several bundles land in one second."""
    d = datetime.datetime.fromtimestamp(wall, datetime.timezone.utc)
    stamp = d.strftime("%Y%m%dT%H%M%S") + f".{d.microsecond // 1000:03d}Z"
    return f"{stamp}-{host_name()}-rank{rank}-pid{pid}"


def host_name() -> str:
    """This machine's short name, safe for a directory name."""
    try:
        name = socket.gethostname().split(".")[0]
    except OSError:
        name = "host"
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:64] or "host"


def dir_size(path: Path) -> int:
    total = 0
    try:
        for entry in os.scandir(path):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return total


class BundleWriter:
    """Writes one bundle into a temporary directory, then renames it into place.

    Every ``write_*`` streams to its file (no whole-file string is built in memory) and never
    raises for a single file: a failed file is recorded in the manifest's ``errors`` and the bundle
    goes on, because a partial bundle with a manifest that says what is missing beats no bundle.

    Nothing is written through a symlink: ``oom_root`` is opened once (its last component never
    followed, owned by this user), the temporary directory is made in it (mode 0700, or 0750
    with ``share="group"``) and held by a file descriptor, and every file is created in that
    descriptor with ``O_EXCL | O_NOFOLLOW`` (mode 0600/0640). A directory swapped for a symlink
    while the bundle is written changes nothing: the descriptors still name the real directory.
    """

    def __init__(self, oom_root: str | os.PathLike[str], name: str,
                 share: str = "private") -> None:
        self.root = Path(oom_root)
        self.name = name
        self.share = modes(share).share
        self._root_fd = open_dir(self.root, create=True, share=share)
        tmp_name = f"{TMP_PREFIX}{host_name()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp_name, modes(share).dir, dir_fd=self._root_fd)
            self._fd = ensure_dir(self._root_fd, tmp_name, share)
        except BaseException:
            os.close(self._root_fd)
            raise
        self.tmp = self.root / tmp_name
        self._tmp_name = tmp_name
        self.errors: dict[str, str] = {}
        self.trimmed: list[dict[str, Any]] = []
        self._pause = float(os.environ.get(_PAUSE_ENV, "0") or 0)
        self._t0 = time.perf_counter()

    def _between_files(self) -> None:
        if self._pause > 0 and os.listdir(self._fd):
            time.sleep(self._pause)

    def _failed(self, fname: str, exc: BaseException) -> None:
        self.errors[fname] = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):
            os.unlink(fname, dir_fd=self._fd)

    def _write(self, fname: str, mode: str, write: Any) -> None:
        self._between_files()
        try:
            fd = create_file(self._fd, fname, self.share)
            with open(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
                write(f)
        except Exception as e:  # noqa: BLE001
            self._failed(fname, e)

    def write_json(self, fname: str, obj: Any) -> None:
        # json.dump streams its chunks to the file (no whole-document string in memory).
        def write(f: Any) -> None:
            json.dump(finite(obj), f, indent=1, default=_json_default, allow_nan=False)
            f.write("\n")
        self._write(fname, "w", write)

    def write_jsonl(self, fname: str, rows: Iterable[dict[str, Any]]) -> None:
        def write(f: Any) -> None:
            for row in rows:
                f.write(json.dumps(finite(row), default=_json_default, allow_nan=False))
                f.write("\n")
        self._write(fname, "w", write)

    def write_text(self, fname: str, text: str) -> None:
        self._write(fname, "w", lambda f: f.write(text))

    def write_pickle(self, fname: str, obj: Any) -> None:
        from memwatch.core import safepickle

        self._write(fname, "wb", lambda f: safepickle.dump(obj, f))

    def sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for fname in sorted(os.listdir(self._fd)):
            if fname == "manifest.json" or fname.endswith(".part"):
                continue
            try:
                st = os.stat(fname, dir_fd=self._fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[fname] = st.st_size
        return out

    def trim(self, max_bytes: int) -> None:
        """Remove optional files, largest first, until the bundle fits ``max_bytes``."""
        sizes = self.sizes()
        total = sum(sizes.values())
        for fname in sorted((f for f in sizes if f in OPTIONAL_FILES), key=lambda f: -sizes[f]):
            if total <= max_bytes:
                break
            try:
                os.unlink(fname, dir_fd=self._fd)
            except OSError:
                continue
            total -= sizes[fname]
            self.trimmed.append({"file": fname, "bytes": sizes[fname]})

    def commit(self, manifest: dict[str, Any]) -> Path:
        """Write the manifest last and rename the directory to its final name."""
        self._between_files()
        files = self.sizes()
        doc = {
            "schema_version": SCHEMA_VERSION,
            "memwatch_version": __version__,
            "name": self.name,
            **manifest,
            "files": files,
            "bytes": sum(files.values()),
            "trimmed": self.trimmed,
            "errors": self.errors,
            "write_seconds": round(time.perf_counter() - self._t0, 4),
            "complete": True,
        }
        _replace_json(self._fd, "manifest.json", doc, self.share)
        mine, there = os.fstat(self._fd), os.stat(self._tmp_name, dir_fd=self._root_fd,
                                                  follow_symlinks=False)
        if (mine.st_dev, mine.st_ino) != (there.st_dev, there.st_ino):
            raise BundleError(f"{self.tmp} was replaced while the bundle was written (by "
                              "another user or process); the bundle is not committed")
        for i in range(1, 1000):
            final = self.name if i == 1 else f"{self.name}-{i}"
            try:
                os.stat(final, dir_fd=self._root_fd, follow_symlinks=False)
                continue  # taken (by a bundle, or by anything else: never replaced)
            except FileNotFoundError:
                pass
            try:
                os.rename(self._tmp_name, final, src_dir_fd=self._root_fd,
                          dst_dir_fd=self._root_fd)
            except OSError:
                with contextlib.suppress(FileNotFoundError):
                    os.stat(final, dir_fd=self._root_fd, follow_symlinks=False)
                    continue
                raise
            self._close()
            return self.root / final
        raise BundleError(f"no free bundle name under {self.root} for {self.name}")

    def _close(self) -> None:
        for fd in (self._fd, self._root_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fd = self._root_fd = -1

    def abort(self) -> None:
        if self._root_fd >= 0:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._tmp_name, dir_fd=self._root_fd)
        self._close()


def _open_bundle_dir(path: Path) -> int:
    """A committed bundle directory of this user's, opened without following its last
    component."""
    return open_dir(path, nofollow=True)


def add_file(path: str | os.PathLike[str], fname: str, text: str,
             max_bytes: int | None = None, share: str = "private") -> bool:
    """Add ``fname`` to a committed bundle and list it in its manifest; True when added.

    For what is only a rendering of the evidence (``report.html``): the bundle is committed first,
    so a process killed while rendering (the kernel's OOM killer, seconds after a watchdog bundle)
    still leaves a complete bundle, and ``memwatch report BUNDLE`` draws the rendering later. The
    file is written under a temporary ``.part`` name and renamed; the manifest is rewritten the
    same way, so a kill at any point leaves a bundle that validates, and a failed write (a full
    disk) removes its ``.part``. Over ``max_bytes`` in all, the file is dropped and the manifest's
    ``trimmed`` says so.
    """
    fd = _open_bundle_dir(Path(path))
    try:
        doc = _read_manifest(fd)
        part = f".{fname}.{secrets.token_hex(6)}.part"
        pfd = create_file(fd, part, share)
        try:
            with open(pfd, "w", encoding="utf-8", errors="replace") as f:  # lone surrogates
                f.write(text)
            size = os.stat(part, dir_fd=fd, follow_symlinks=False).st_size
            files = dict(doc.get("files") or {})
            if max_bytes is not None and sum(files.values()) + size > max_bytes:
                os.unlink(part, dir_fd=fd)
                doc["trimmed"] = [*doc.get("trimmed", []), {"file": fname, "bytes": size}]
                added = False
            else:
                os.replace(part, fname, src_dir_fd=fd, dst_dir_fd=fd)
                files[fname] = size
                doc["files"] = dict(sorted(files.items()))
                doc["bytes"] = sum(files.values())
                added = True
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(part, dir_fd=fd)
            raise
        _replace_json(fd, "manifest.json", doc, share)
        return added
    finally:
        os.close(fd)


def note_error(path: str | os.PathLike[str], fname: str, error: str,
               share: str = "private") -> None:
    """Record in a committed bundle's manifest that ``fname`` could not be added."""
    fd = _open_bundle_dir(Path(path))
    try:
        doc = _read_manifest(fd)
        doc["errors"] = {**doc.get("errors", {}), fname: error}
        _replace_json(fd, "manifest.json", doc, share)
    finally:
        os.close(fd)


def _read_manifest(dir_fd: int) -> dict[str, Any]:
    from memwatch.bundle.schema import MAX_BYTES

    raw = read_bounded("manifest.json", MAX_BYTES["manifest.json"], dir_fd=dir_fd)
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise BundleError("manifest.json is not a JSON object")
    return doc


def _replace_json(dir_fd: int, fname: str, doc: dict[str, Any], share: str) -> None:
    """Write ``doc`` as ``fname`` in ``dir_fd`` atomically: a fresh ``.part`` file, fsynced,
    then renamed (removed when the write fails)."""
    def write(f: Any) -> None:
        data = json.dumps(finite(doc), indent=1, default=_json_default, allow_nan=False)
        f.write(data.encode("utf-8") + b"\n")
    write_atomic(dir_fd, fname, write, share=share, fsync=True)
