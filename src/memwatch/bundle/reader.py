"""Reading a bundle that may come from anyone: validated, bounded, one-line errors.

A bundle travels: to a colleague, into a bug report, onto a shared disk. :func:`open_bundle`
trusts nothing in it:

* only files the manifest lists are read, and a listed name must be a plain file name (no
  ``/``, no ``..``): a manifest cannot point outside its bundle;
* each is read as a regular file, never through a symlink, never a FIFO or device, up to a size
  cap per file (:data:`memwatch.bundle.schema.MAX_BYTES`); ``timeline.jsonl`` is read from its
  last :data:`TIMELINE_TAIL_BYTES` when it is longer (its header line is read too);
* JSON is parsed with a nesting cap, must be UTF-8, and its known fields must have their types
  (:mod:`memwatch.bundle.schema`); strings are cut at 64 KiB and stripped of terminal control
  characters (:func:`memwatch.core.untrusted.sanitize`);
* the snapshot goes through the restricted unpickler, which also refuses a small pickle that
  expands into a huge object graph.

Every problem is a :class:`memwatch.core.errors.BundleError` with one line naming the file; in
:func:`find_bundles` one bad bundle is one error entry and never hides the others.

Example::

    >>> import memwatch
    >>> from memwatch.bundle import open_bundle
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=tmp, signals=False) as mw:
    ...     mw.step()
    ...     path = mw.dump("a look")
    >>> b = open_bundle(path)
    >>> b.manifest["trigger"], b.has("memory.json"), b.has("../manifest.json")
    ('manual', True, False)
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memwatch._version import __version__
from memwatch.bundle import schema
from memwatch.bundle.format import BUNDLE_SUBDIRS, SCHEMA_VERSION, TMP_PREFIX
from memwatch.core.errors import BundleError
from memwatch.core.safefs import open_regular, read_bounded
from memwatch.core.untrusted import loads_json, sanitize

__all__ = ["TIMELINE_TAIL_BYTES", "Bundle", "find_bundles", "open_bundle"]

#: A ``timeline.jsonl`` longer than this is read from its end only (the newest samples).
TIMELINE_TAIL_BYTES = 16 << 20
#: The longest line of ``timeline.jsonl`` read (a memwatch sample is a few KiB).
MAX_LINE_BYTES = 1 << 20
# A file name in a manifest: one plain component.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def _doc(path: Path, fname: str, data: bytes) -> Any:
    try:
        doc = loads_json(data, str(path / fname))
    except ValueError as e:
        raise BundleError(f"{e} (corrupted or truncated JSON)") from None
    err = schema.check(fname, doc)
    if err:
        raise BundleError(f"{path / fname}: {err} (not a memwatch bundle, or modified)")
    return sanitize(doc)


def _read(path: Path, fname: str, cap: int) -> bytes:
    try:
        return read_bounded(path / fname, cap)
    except FileNotFoundError:
        raise BundleError(f"{path}: incomplete bundle ({fname} listed in the manifest is "
                          "missing)") from None
    except OSError as e:  # UnsafePathError says what it refused
        raise BundleError(f"{path / fname}: cannot read ({e})") from None


@dataclasses.dataclass
class Bundle:
    """A bundle directory opened for reading (see :func:`open_bundle`, which validates it)."""

    path: Path
    manifest: dict[str, Any]
    #: What the reader left out (a timeline read from its end only...), for the renderers.
    notes: list[str] = dataclasses.field(default_factory=list)

    def _files(self) -> dict[str, Any]:
        files = self.manifest.get("files")
        return files if isinstance(files, dict) else {}

    def has(self, fname: str) -> bool:
        """Whether the manifest lists ``fname`` (the only files a reader opens)."""
        return fname in self._files() and bool(_PLAIN_NAME.fullmatch(fname))

    def read_json(self, fname: str, default: Any = None) -> Any:
        """A JSON document of the bundle, validated (``default`` when the manifest does not list
        it); :class:`BundleError` when it is not readable or not what memwatch writes."""
        if not self.has(fname):
            return default
        cap = schema.MAX_BYTES.get(fname, schema.MAX_OTHER_BYTES)
        return _doc(self.path, fname, _read(self.path, fname, cap))

    def timeline(self) -> Iterator[dict[str, Any]]:
        """Records of ``timeline.jsonl`` (header, samples, epochs), one at a time."""
        if not self.has("timeline.jsonl"):
            return
        p = self.path / "timeline.jsonl"
        try:
            fd = open_regular(p)
        except OSError as e:  # UnsafePathError says what it refused
            raise BundleError(f"{p}: cannot read ({e})") from None
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if st.st_size > TIMELINE_TAIL_BYTES:
                # The header is the first line; then only the newest samples and the epochs.
                yield from self._lines(p, [(1, f.readline(MAX_LINE_BYTES + 1))])
                f.seek(st.st_size - TIMELINE_TAIL_BYTES)
                f.readline(MAX_LINE_BYTES + 1)  # the partial line at the cut
                self.notes.append(
                    f"timeline.jsonl is {st.st_size} bytes: only its last "
                    f"{TIMELINE_TAIL_BYTES >> 20} MiB were read (the newest samples)")
                left = TIMELINE_TAIL_BYTES
                yield from self._lines(p, _numbered(f, left))
            else:
                yield from self._lines(p, _numbered(f, st.st_size))

    @staticmethod
    def _lines(p: Path, lines: Any) -> Iterator[dict[str, Any]]:
        for lineno, line in lines:
            if len(line) > MAX_LINE_BYTES:
                raise BundleError(f"{p}:{lineno}: a line over {MAX_LINE_BYTES} bytes")
            if not line.strip():
                continue
            try:
                rec = loads_json(line, "line")
            except ValueError as e:
                why = str(e).removeprefix("line: ")
                raise BundleError(f"{p}:{lineno}: corrupted or truncated line ({why})") from None
            err = schema.check_record(rec)
            if err:
                raise BundleError(f"{p}:{lineno}: {err}")
            yield sanitize(rec)

    def snapshot(self) -> Any:
        """The allocator snapshot, through the restricted unpickler (never runs code, refuses a
        pickle that expands into a huge or shared object graph)."""
        from memwatch.core import safepickle

        if not self.has("snapshot.pickle"):
            return None
        data = _read(self.path, "snapshot.pickle", schema.MAX_BYTES["snapshot.pickle"])
        return safepickle.loads(data)


def _numbered(f: Any, limit: int) -> Iterator[tuple[int, bytes]]:
    n = 0
    read = 0
    while read < limit:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        n += 1
        read += len(line)
        yield n, line


def _manifest(p: Path) -> dict[str, Any]:
    mpath = p / "manifest.json"
    try:
        data = read_bounded(mpath, schema.MAX_BYTES["manifest.json"])
    except FileNotFoundError:
        if p.name.startswith(TMP_PREFIX):
            raise BundleError(f"{p}: incomplete bundle (its writer was interrupted mid-write)"
                              ) from None
        raise BundleError(f"{p}: no manifest.json (not a memwatch bundle, or incomplete)"
                          ) from None
    except OSError as e:
        raise BundleError(f"{mpath}: cannot read ({e})") from None
    try:
        manifest = loads_json(data, str(mpath))
    except ValueError as e:
        raise BundleError(f"{e} (corrupted or truncated manifest)") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{mpath}: manifest is not a JSON object")
    schema_v = manifest.get("schema_version")
    if schema_v != SCHEMA_VERSION:
        raise BundleError(
            f"{mpath}: unknown bundle schema_version {repr(schema_v)[:40]} (this memwatch "
            f"{__version__} reads version {SCHEMA_VERSION}; upgrade memwatch to read newer "
            "bundles)")
    if manifest.get("complete") is not True:
        raise BundleError(f"{p}: incomplete bundle (manifest not marked complete)")
    if not isinstance(manifest.get("files"), dict):
        raise BundleError(f"{mpath}: manifest has no 'files' table")
    err = schema.check("manifest.json", manifest)
    if err:
        raise BundleError(f"{mpath}: {err} (not a memwatch bundle, or modified)")
    return sanitize(manifest)  # type: ignore[no-any-return]


def open_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Open and validate a bundle; raises :class:`memwatch.core.errors.BundleError` (one line)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise BundleError(f"{p}: no such bundle directory") from None
    except OSError as e:
        raise BundleError(f"{p}: cannot read ({e})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BundleError(f"{p}: not a directory (a bundle is a directory with a manifest.json)")
    manifest = _manifest(p)
    for fname, size in manifest["files"].items():
        if not _PLAIN_NAME.fullmatch(fname):
            raise BundleError(f"{p}: the manifest names {fname!r}, not a file of this bundle "
                              "(refused: a bundle's files are plain names inside it)")
        fp = p / fname
        try:
            fst = os.lstat(fp)
        except FileNotFoundError:
            raise BundleError(f"{p}: incomplete bundle ({fname} listed in the manifest is "
                              "missing)") from None
        except OSError as e:
            raise BundleError(f"{fp}: cannot read ({e})") from None
        if stat.S_ISLNK(fst.st_mode):
            raise BundleError(f"{fp}: a symlink (refused: a bundle holds regular files only)")
        if not stat.S_ISREG(fst.st_mode):
            raise BundleError(f"{fp}: not a regular file (refused)")
        if fst.st_size != size:
            raise BundleError(
                f"{fp}: {fst.st_size} bytes but the manifest says {size} (truncated or modified)")
    return Bundle(p, manifest)


def _is_dir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def _has_manifest(p: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(p / "manifest.json").st_mode)
    except OSError:
        return False


def _subdirs(d: Path) -> list[Path]:
    """Directories in ``d``, symlinks left out (never followed out of the folder)."""
    try:
        entries = list(os.scandir(d))
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]


def find_bundles(directory: str | os.PathLike[str]) -> list[tuple[Path, Bundle | BundleError]]:
    """Bundles under ``directory`` (an ``out_dir``, its ``oom/`` or ``end_of_run/``, or a folder
    of per-rank ``out_dir``s such as ``run/rank0/oom/...``), oldest first. Outside those folders
    only a folder with a ``manifest.json`` (or a writer's ``.tmp-`` one) is taken for a bundle:
    other tools' folders beside an ``out_dir`` (``wandb/``, ``lightning_logs/``) are not.

    Each entry is the path and either the opened bundle or the error that stops it from opening.
    Temporary directories of writers still running (or of crashed ones) are included as errors.
    Symlinks inside the folder are not followed.
    """
    d = Path(directory)
    if not d.is_dir():
        raise BundleError(f"{d}: no such directory")
    if _has_manifest(d) or d.name.startswith(TMP_PREFIX):
        candidates = [d]
    else:
        candidates = []
        roots = [d / sub for sub in BUNDLE_SUBDIRS if _is_dir(d / sub)]
        if d.name in BUNDLE_SUBDIRS:
            roots.append(d)
        for r in roots:  # oom/, end_of_run/: every folder in them is a bundle, or a broken one
            candidates.extend(_subdirs(r))
        if not roots:
            for c in _subdirs(d):
                if _has_manifest(c) or c.name.startswith(TMP_PREFIX):
                    candidates.append(c)
                else:  # one rank's out_dir; anything else is another tool's folder (wandb/)
                    for sub in BUNDLE_SUBDIRS:
                        if _is_dir(c / sub):
                            candidates.extend(_subdirs(c / sub))
        # Names start with the UTC time: sorting by name is oldest first across folders too.
        candidates.sort(key=lambda c: (c.name.startswith(TMP_PREFIX), c.name, str(c)))
    out: list[tuple[Path, Bundle | BundleError]] = []
    for c in candidates:
        try:
            out.append((c, open_bundle(c)))
        except BundleError as e:
            out.append((c, e))
        except (OSError, ValueError, RecursionError, MemoryError) as e:  # never hides the rest
            out.append((c, BundleError(f"{c}: unreadable ({type(e).__name__}: {e})")))
    return out
