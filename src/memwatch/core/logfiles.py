"""A rotated JSON-lines log read as untrusted: its files listed, each read bounded, line by line.

:class:`memwatch.sinks.JsonlSink` writes ``events.jsonl`` and, when it rotates, renames older
files ``events.jsonl.1``, ``.2``... A log handed to ``memwatch report`` can come from anyone, and
so can what lies beside it. :func:`log_files` and :func:`log_lines` read it the way a bundle is
read (:mod:`memwatch.bundle.reader`):

* a rotated file is ``<name>.<N>`` with ``N`` ASCII digits only (``events.jsonl.²`` is not one);
* every file must be a regular file, never a symlink (not even one pointing at a sibling), a
  FIFO, a device or a directory: one that is not refuses the whole log with
  :class:`memwatch.core.errors.UnsafePathError` naming it, before anything is read (a FIFO
  would block a reader forever, ``/dev/zero`` would feed it until memory runs out);
* at most :data:`MAX_LOG_BYTES` are read in all, newest first: the older part of a larger file,
  and older files, are left out, and a note says so (a sparse 8 GiB file costs the read of its
  last 64 MiB, not minutes);
* a line longer than :data:`MAX_LINE_BYTES` is skipped unread, said in a note.

Example::

    >>> import os
    >>> from memwatch.core.logfiles import log_files, log_lines
    >>> log = os.path.join(tmp, "events.jsonl")
    >>> for name, text in (("events.jsonl", "c\\n"), ("events.jsonl.1", "b\\n"),
    ...                    ("events.jsonl.2", "a\\n"), ("events.jsonl.\\u00b2", "no\\n")):
    ...     with open(os.path.join(tmp, name), "w") as f:
    ...         _ = f.write(text)
    >>> [p.name for p in log_files(log)]
    ['events.jsonl.2', 'events.jsonl.1', 'events.jsonl']
    >>> notes = []
    >>> [(p.name, n, line) for p, n, line in log_lines(log, notes)]
    [('events.jsonl.2', 1, b'a\\n'), ('events.jsonl.1', 1, b'b\\n'), ('events.jsonl', 1, b'c\\n')]
    >>> os.symlink("/dev/zero", os.path.join(tmp, "events.jsonl.3"))
    >>> log_files(log)
    Traceback (most recent call last):
    ...
    memwatch.core.errors.UnsafePathError: .../events.jsonl.3 is a symlink (refused: ...)
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from memwatch.core.errors import UnsafePathError
from memwatch.core.safefs import open_regular
from memwatch.core.units import fmt_bytes

__all__ = ["MAX_LINE_BYTES", "MAX_LOG_BYTES", "MAX_LOG_FILES", "bounded_lines", "log_files",
           "log_lines"]

#: Most bytes read of a log and its rotated files together (the newest; JsonlSink's default
#: file is 64 MiB: the live file and the newest part of the one before).
MAX_LOG_BYTES = 64 << 20
#: Longest line read (a memwatch event is a few KiB; a findings event tens of KiB).
MAX_LINE_BYTES = 1 << 20
#: Most rotated files listed (the newest; JsonlSink keeps 5 by default).
MAX_LOG_FILES = 256
# <name>.<N>: ASCII digits only ([0-9], not \d, which matches "²" and other digits int() may
# refuse), at most 9 of them.
_ROTATED = re.compile(r"[0-9]{1,9}")


def _what(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def log_files(path: str | os.PathLike[str], notes: list[str] | None = None) -> list[Path]:
    """``path`` and its rotated files, oldest first (``<name>.<N>`` with the largest ``N``
    first; at most :data:`MAX_LOG_FILES` rotated ones, the newest). Raises
    :class:`UnsafePathError` when one of them is not a regular file (see the module doc),
    ``FileNotFoundError`` when there is none."""
    p = Path(path)
    prefix = p.name + "."
    rotated: list[tuple[int, Path]] = []
    try:
        with os.scandir(p.parent) as it:
            for e in it:
                if e.name.startswith(prefix) and _ROTATED.fullmatch(e.name[len(prefix):]):
                    rotated.append((int(e.name[len(prefix):]), Path(e.path)))
    except OSError:
        rotated = []
    rotated.sort(key=lambda t: t[0])
    if len(rotated) > MAX_LOG_FILES:
        if notes is not None:
            notes.append(f"{len(rotated) - MAX_LOG_FILES} rotated files older than "
                         f"{rotated[MAX_LOG_FILES - 1][1].name} were left out (at most "
                         f"{MAX_LOG_FILES} are read)")
        rotated = rotated[:MAX_LOG_FILES]
    files = []
    for q in [q for _, q in reversed(rotated)] + [p]:
        try:
            mode = os.lstat(q).st_mode
        except FileNotFoundError:
            continue  # rotated away while listed, or the live file not yet written again
        if not stat.S_ISREG(mode):
            raise UnsafePathError(f"{q} is {_what(mode)} (refused: a log's files are regular "
                                  "files; remove it)")
        files.append(q)
    if not files:
        os.lstat(p)  # FileNotFoundError naming it
    return files


def bounded_lines(f: BinaryIO, limit: int, skipped: list[int]) -> Iterator[tuple[int, bytes]]:
    """Numbered lines of ``f`` from where it stands, ``limit`` bytes at most; a line over
    :data:`MAX_LINE_BYTES` is consumed without being kept (counted in ``skipped[0]``)."""
    n = 0
    left = limit
    while left > 0:
        line = f.readline(min(MAX_LINE_BYTES + 1, left))
        if not line:
            return
        left -= len(line)
        n += 1
        if len(line) > MAX_LINE_BYTES:
            skipped[0] += 1
            while left > 0 and not line.endswith(b"\n"):  # the rest of the long line
                line = f.readline(min(MAX_LINE_BYTES, left))
                if not line:
                    return
                left -= len(line)
            continue
        yield n, line


def log_lines(path: str | os.PathLike[str], notes: list[str],
              max_bytes: int = MAX_LOG_BYTES) -> Iterator[tuple[Path, int, bytes]]:
    """``(file, line number, line)`` of a log and its rotated files, oldest first, at most
    ``max_bytes`` read in all (the newest); what is left out is said in ``notes``. Raises
    :class:`UnsafePathError` (see the module doc) or ``OSError`` before yielding anything."""
    files = log_files(path, notes)
    sizes: list[int] = []
    for q in files:
        try:
            sizes.append(os.lstat(q).st_size)
        except FileNotFoundError:
            sizes.append(0)
    # The newest files first until the budget is spent: which part of each is read.
    budget = max_bytes
    take: list[int] = [0] * len(files)
    for i in range(len(files) - 1, -1, -1):
        take[i] = min(sizes[i], budget)
        budget -= take[i]
    left_out = [q.name for q, t, s in zip(files, take, sizes, strict=True) if s and not t]
    if left_out:
        notes.append(f"{len(left_out)} older file(s) of the log left out ({left_out[-1]} and "
                     f"older): at most {fmt_bytes(max_bytes)} of a log are read, the newest")
    for q, t, size in zip(files, take, sizes, strict=True):
        if not t:
            continue
        try:
            fd = open_regular(q)
        except FileNotFoundError:
            continue
        skipped = [0]
        with open(fd, "rb") as f:
            if size > t:  # read its end: the newest lines (numbered from the cut)
                f.seek(size - t)
                f.readline(MAX_LINE_BYTES)  # the partial line at the cut
                notes.append(f"{q.name} is {size} bytes: only its last {fmt_bytes(t)} were read "
                             "(the newest lines; line numbers count from there)")
            for n, line in bounded_lines(f, t, skipped):
                yield q, n, line
        if skipped[0]:
            notes.append(f"{q.name}: {skipped[0]} line(s) over {MAX_LINE_BYTES >> 20} MiB "
                         "skipped")
