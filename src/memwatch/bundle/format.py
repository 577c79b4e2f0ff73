"""The OOM bundle on disk: atomic writing, validated reading, retention.

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

``report.html`` is only a rendering of the other files, and rendering it takes memory and time a
dying process may not have: it is added to the committed bundle by :func:`add_file` (the manifest
rewritten atomically), so a kill while it renders leaves a complete bundle without it.

Example::

    >>> from memwatch.bundle import BundleWriter, open_bundle
    >>> import os
    >>> w = BundleWriter(os.path.join(tmp, "oom"), "20260101T000000Z-host-rank0-pid1")
    >>> w.write_json("environment.json", {"python": "3.11"})
    >>> w.write_json("findings.json", [])
    >>> w.write_json("memory.json", {"latest": {}, "limits": {}})
    >>> path = w.commit({"trigger": "manual", "classification": None})
    >>> open_bundle(path).manifest["complete"]
    True
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memwatch._version import __version__
from memwatch.core.errors import BundleError

__all__ = [
    "OOM_SUBDIR",
    "OPTIONAL_FILES",
    "REQUIRED_FILES",
    "SCHEMA_VERSION",
    "TMP_PREFIX",
    "Bundle",
    "add_file",
    "BundleWriter",
    "dir_size",
    "find_bundles",
    "host_name",
    "note_error",
    "open_bundle",
]

SCHEMA_VERSION = 1
OOM_SUBDIR = "oom"
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


def _finite(x: Any) -> Any:
    """JSON has no NaN/Infinity: map them to null (recursively for containers)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


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
    """

    def __init__(self, oom_root: str | os.PathLike[str], name: str) -> None:
        self.root = Path(oom_root)
        self.name = name
        self.root.mkdir(parents=True, exist_ok=True)
        tmp_name = f"{TMP_PREFIX}{host_name()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.tmp = self.root / tmp_name
        self.tmp.mkdir()
        self.errors: dict[str, str] = {}
        self.trimmed: list[dict[str, Any]] = []
        self._pause = float(os.environ.get(_PAUSE_ENV, "0") or 0)
        self._t0 = time.perf_counter()

    def _between_files(self) -> None:
        if self._pause > 0 and any(True for _ in os.scandir(self.tmp)):
            time.sleep(self._pause)

    def _failed(self, fname: str, exc: BaseException) -> None:
        self.errors[fname] = f"{type(exc).__name__}: {exc}"
        try:
            (self.tmp / fname).unlink(missing_ok=True)
        except OSError:
            pass

    def write_json(self, fname: str, obj: Any) -> None:
        self._between_files()
        try:
            with open(self.tmp / fname, "w", encoding="utf-8") as f:
                # json.dump streams its chunks to the file (no whole-document string in memory).
                json.dump(_finite(obj), f, indent=1, default=_json_default, allow_nan=False)
                f.write("\n")
        except Exception as e:  # noqa: BLE001
            self._failed(fname, e)

    def write_jsonl(self, fname: str, rows: Iterable[dict[str, Any]]) -> None:
        self._between_files()
        try:
            with open(self.tmp / fname, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(_finite(row), default=_json_default, allow_nan=False))
                    f.write("\n")
        except Exception as e:  # noqa: BLE001
            self._failed(fname, e)

    def write_text(self, fname: str, text: str) -> None:
        self._between_files()
        try:
            with open(self.tmp / fname, "w", encoding="utf-8") as f:
                f.write(text)
        except Exception as e:  # noqa: BLE001
            self._failed(fname, e)

    def write_pickle(self, fname: str, obj: Any) -> None:
        from memwatch.core import safepickle

        self._between_files()
        try:
            with open(self.tmp / fname, "wb") as f:
                safepickle.dump(obj, f)
        except Exception as e:  # noqa: BLE001
            self._failed(fname, e)

    def sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry in sorted(os.scandir(self.tmp), key=lambda e: e.name):
            if entry.is_file() and entry.name != "manifest.json":
                out[entry.name] = entry.stat().st_size
        return out

    def trim(self, max_bytes: int) -> None:
        """Remove optional files, largest first, until the bundle fits ``max_bytes``."""
        sizes = self.sizes()
        total = sum(sizes.values())
        for fname in sorted((f for f in sizes if f in OPTIONAL_FILES), key=lambda f: -sizes[f]):
            if total <= max_bytes:
                break
            try:
                (self.tmp / fname).unlink()
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
        _replace_json(self.tmp / "manifest.json", doc)
        final = self.root / self.name
        for i in range(2, 1000):
            if not final.exists():
                try:
                    os.rename(self.tmp, final)
                    return final
                except OSError:
                    if not final.exists():
                        raise
            final = self.root / f"{self.name}-{i}"
        raise BundleError(f"no free bundle name under {self.root} for {self.name}")

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def add_file(path: str | os.PathLike[str], fname: str, text: str,
             max_bytes: int | None = None) -> bool:
    """Add ``fname`` to a committed bundle and list it in its manifest; True when added.

    For what is only a rendering of the evidence (``report.html``): the bundle is committed first,
    so a process killed while rendering (the kernel's OOM killer, seconds after a watchdog bundle)
    still leaves a complete bundle, and ``memwatch report BUNDLE`` draws the rendering later. The
    file is written under a ``.part`` name and renamed; the manifest is rewritten the same way, so
    a kill at any point leaves a bundle that validates. Over ``max_bytes`` in all, the file is
    dropped and the manifest's ``trimmed`` says so.
    """
    p = Path(path)
    mpath = p / "manifest.json"
    with open(mpath, encoding="utf-8") as f:
        doc = json.load(f)
    part = p / (fname + ".part")
    with open(part, "w", encoding="utf-8") as f:
        f.write(text)
    size = part.stat().st_size
    files = dict(doc.get("files") or {})
    if max_bytes is not None and sum(files.values()) + size > max_bytes:
        part.unlink(missing_ok=True)
        doc["trimmed"] = [*doc.get("trimmed", []), {"file": fname, "bytes": size}]
        added = False
    else:
        os.replace(part, p / fname)
        files[fname] = size
        doc["files"] = dict(sorted(files.items()))
        doc["bytes"] = sum(files.values())
        added = True
    _replace_json(mpath, doc)
    return added


def note_error(path: str | os.PathLike[str], fname: str, error: str) -> None:
    """Record in a committed bundle's manifest that ``fname`` could not be added."""
    mpath = Path(path) / "manifest.json"
    with open(mpath, encoding="utf-8") as f:
        doc = json.load(f)
    doc["errors"] = {**doc.get("errors", {}), fname: error}
    _replace_json(mpath, doc)


def _replace_json(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically: a ``.part`` file, fsynced, then renamed."""
    part = path.with_name(path.name + ".part")
    with open(part, "w", encoding="utf-8") as f:
        json.dump(_finite(doc), f, indent=1, default=_json_default, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


# --------------------------------------------------------------------------- reading
@dataclasses.dataclass
class Bundle:
    """A bundle directory opened for reading (see :func:`open_bundle`, which validates it)."""

    path: Path
    manifest: dict[str, Any]

    def has(self, fname: str) -> bool:
        return (self.path / fname).is_file()

    def read_json(self, fname: str, default: Any = None) -> Any:
        p = self.path / fname
        if not p.is_file():
            return default
        try:
            with open(p, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise BundleError(f"{p}: corrupted or truncated JSON ({e})") from None

    def timeline(self) -> Iterator[dict[str, Any]]:
        """Records of ``timeline.jsonl`` (header, samples, epochs), one at a time."""
        p = self.path / "timeline.jsonl"
        if not p.is_file():
            return
        try:
            f = open(p, encoding="utf-8")
        except OSError as e:
            raise BundleError(f"{p}: cannot read ({e})") from None
        with f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    raise BundleError(f"{p}:{lineno}: corrupted or truncated line ({e})") from None
                if not isinstance(rec, dict):
                    raise BundleError(f"{p}:{lineno}: expected a JSON object per line")
                yield rec

    def snapshot(self) -> Any:
        """The allocator snapshot, through the restricted unpickler (never runs code)."""
        from memwatch.core import safepickle

        p = self.path / "snapshot.pickle"
        if not p.is_file():
            return None
        return safepickle.load(p)


def open_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Open and validate a bundle; raises :class:`memwatch.core.errors.BundleError` (one line)."""
    p = Path(path)
    if not p.exists():
        raise BundleError(f"{p}: no such bundle directory")
    if not p.is_dir():
        raise BundleError(f"{p}: not a directory (a bundle is a directory with a manifest.json)")
    mpath = p / "manifest.json"
    if not mpath.is_file():
        if p.name.startswith(TMP_PREFIX):
            raise BundleError(f"{p}: incomplete bundle (its writer was interrupted mid-write)")
        raise BundleError(f"{p}: no manifest.json (not a memwatch bundle, or incomplete)")
    try:
        with open(mpath, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise BundleError(f"{mpath}: corrupted or truncated manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{mpath}: manifest is not a JSON object")
    schema = manifest.get("schema_version")
    if schema != SCHEMA_VERSION:
        raise BundleError(
            f"{mpath}: unknown bundle schema_version {schema!r} (this memwatch {__version__} "
            f"reads version {SCHEMA_VERSION}; upgrade memwatch to read newer bundles)"
        )
    if manifest.get("complete") is not True:
        raise BundleError(f"{p}: incomplete bundle (manifest not marked complete)")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise BundleError(f"{mpath}: manifest has no 'files' table")
    for fname, size in files.items():
        fp = p / str(fname)
        if not fp.is_file():
            raise BundleError(f"{p}: incomplete bundle ({fname} listed in the manifest is missing)")
        actual = fp.stat().st_size
        if isinstance(size, int) and actual != size:
            raise BundleError(
                f"{fp}: {actual} bytes but the manifest says {size} (truncated or modified)"
            )
    return Bundle(p, manifest)


def find_bundles(directory: str | os.PathLike[str]) -> list[tuple[Path, Bundle | BundleError]]:
    """Bundles under ``directory`` (an ``out_dir``, its ``oom/``, or a folder of per-rank
    ``out_dir``s such as ``run/rank0/oom/...``), oldest first.

    Each entry is the path and either the opened bundle or the error that stops it from opening.
    Temporary directories of writers still running (or of crashed ones) are included as errors.
    """
    d = Path(directory)
    if not d.is_dir():
        raise BundleError(f"{d}: no such directory")
    if (d / "manifest.json").is_file() or d.name.startswith(TMP_PREFIX):
        candidates = [d]
    else:
        root = d / OOM_SUBDIR if (d / OOM_SUBDIR).is_dir() else d
        candidates = []
        for c in root.iterdir():
            if not c.is_dir():
                continue
            if not (c / "manifest.json").is_file() and not c.name.startswith(TMP_PREFIX) \
                    and (c / OOM_SUBDIR).is_dir():  # one rank's out_dir
                candidates.extend(x for x in (c / OOM_SUBDIR).iterdir() if x.is_dir())
            else:
                candidates.append(c)
        # Names start with the UTC time: sorting by name is oldest first across folders too.
        candidates.sort(key=lambda c: (c.name.startswith(TMP_PREFIX), c.name, str(c)))
    out: list[tuple[Path, Bundle | BundleError]] = []
    for c in candidates:
        try:
            out.append((c, open_bundle(c)))
        except BundleError as e:
            out.append((c, e))
    return out
