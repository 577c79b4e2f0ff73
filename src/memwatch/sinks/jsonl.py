"""An append-only JSON-lines event log, rotated by size, with a bounded number of files.

One event per line, written with a single ``write()`` on a file opened in append mode, so lines
from one process never interleave and a crash leaves at most one truncated last line (readers
skip a line that does not parse). Events:

=============  ==============================================================================
``event``      fields
=============  ==============================================================================
``start``      ``time``, ``rank``, ``pid``, ``host``, ``local_rank``, ``world_size``, ``job``
``sample``     ``time``, ``rank``, ``step``, ``metrics`` (metric -> bytes or count; null = NaN)
``findings``   ``time``, ``rank``, ``stage``, ``at``, ``epoch``, ``step``, ``check``,
               ``end_step``, ``findings`` (``Finding.to_dict``): one per check, every loop
``bundle``     ``time``, ``rank``, ``path``, ``manifest``
``close``      ``time``, ``rank``
=============  ==============================================================================

When the file would grow past ``max_bytes`` it is renamed ``<name>.1`` (older ones shift to
``.2``...), and files past ``max_files`` in all are deleted, oldest first.

The log is private: created with mode 0600 (0640 with ``share="group"``), its directory 0700,
opened with ``O_NOFOLLOW``. A ``path`` that is a symlink, not a regular file, someone else's
file, or in a directory other users can write (not sticky and yours) raises
:class:`memwatch.ConfigError` when the sink is created. Findings are redacted at birth; every
other event but the samples is redacted again here (the bundle's manifest, the job).

Example::

    >>> import json, os, memwatch
    >>> from memwatch.sinks import JsonlSink
    >>> log_path = os.path.join(tmp, "events.jsonl")
    >>> sink = JsonlSink(log_path)
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp), sinks=[sink],
    ...                     log_every_n_steps=5) as mw:
    ...     for _ in range(10):
    ...         mw.step()
    >>> from memwatch.sinks.jsonl import read_events
    >>> events = read_events(log_path)
    >>> [e["event"] for e in events]
    ['start', 'sample', 'sample', 'findings', 'close']
    >>> events[2]["step"]
    10
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memwatch.core.errors import ConfigError, UnsafePathError
from memwatch.core.jsonable import jsonable
from memwatch.core.logfiles import log_files, log_lines
from memwatch.core.protocols import CheckReport
from memwatch.core.redact import redact_obj
from memwatch.core.safefs import check_dir_stat, modes, open_append
from memwatch.core.untrusted import loads_json

__all__ = ["JsonlSink", "read_events"]


class JsonlSink:
    """Writes every sink event as one JSON line to ``path`` (see the module doc for the format).

    Args:
        path: the log file; its directory is created. A rank > 0 (``RANK`` in the environment)
            writes ``<stem>.rank<N><suffix>`` instead, so ranks never share a file.
        max_bytes: rotate when the file would grow past this.
        max_files: files kept in all (the live one plus ``max_files - 1`` rotated ones).
        rank: this process's rank; default from the ``RANK`` environment variable.
        share: ``"private"`` (default: the log is 0600) or ``"group"`` (0640).
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 64 << 20,
                 max_files: int = 5, rank: int | None = None, share: str = "private") -> None:
        if not isinstance(max_bytes, int) or max_bytes < 4096:
            raise ConfigError(f"max_bytes={max_bytes!r} must be an int >= 4096 (bytes per file).")
        if not isinstance(max_files, int) or max_files < 1:
            raise ConfigError(f"max_files={max_files!r} must be an int >= 1 (files kept).")
        self.rank = int(os.environ.get("RANK", "0") or 0) if rank is None else int(rank)
        p = Path(path)
        if self.rank > 0:
            p = p.with_name(f"{p.stem}.rank{self.rank}{p.suffix}")
        self.share = modes(share).share
        _check_path(p)
        self.path = p
        self.max_bytes = max_bytes
        self.max_files = max_files
        self._fd: int | None = None
        self._size = 0
        self.closed = False

    # ------------------------------------------------------------------ file
    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=modes(self.share).dir)
            self._fd = open_append(self.path, self.share)  # never through a symlink
            self._size = os.fstat(self._fd).st_size
            self._write({"event": "start", "pid": os.getpid(), **_origin()})
        return self._fd

    def _rotate(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        keep = self.max_files - 1
        if keep <= 0:
            self.path.unlink(missing_ok=True)
            return
        oldest = self.path.with_name(f"{self.path.name}.{keep}")
        oldest.unlink(missing_ok=True)
        for i in range(keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.path.exists():
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    def _write(self, event: dict[str, Any]) -> None:
        event = {**event, "time": round(time.time(), 3), "rank": self.rank}
        if event["event"] != "sample":  # samples are numbers under metric names
            event = redact_obj(event)
        line = (json.dumps(jsonable(event), separators=(",", ":"), allow_nan=False)
                + "\n").encode()
        fd = self._fd if self._fd is not None else self._open()
        if self._size and self._size + len(line) > self.max_bytes:
            self._rotate()
            fd = self._open()
        os.write(fd, line)  # one write per line: appends never interleave within a line
        self._size += len(line)

    # ------------------------------------------------------------------ sink protocol
    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        self._write({"event": "sample", "step": int(step), "metrics": dict(sample)})

    def on_check(self, report: CheckReport) -> None:
        self._write({"event": "findings", "stage": report.stage, "at": report.at,
                     "epoch": int(report.epoch), "step": int(report.step),
                     "check": int(report.check),
                     "end_step": getattr(report.summary, "end_step", None),
                     "findings": [f.to_dict() for f in report.findings]})

    def on_bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        self._write({"event": "bundle", "path": str(path), "manifest": dict(manifest)})

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._fd is not None:
            self._write({"event": "close"})
            os.close(self._fd)
            self._fd = None


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every event of a log and its rotated files, oldest first (a torn last line is skipped).

    Read as untrusted (:func:`memwatch.core.logfiles.log_lines`: regular files only, never
    through a symlink, the newest 64 MiB); raises ``OSError`` (an
    :class:`memwatch.core.errors.UnsafePathError` for a FIFO, a device or a symlink)."""
    out: list[dict[str, Any]] = []
    try:
        log_files(path)
    except FileNotFoundError:
        return out
    for _, _, line in log_lines(path, []):
        try:
            ev = loads_json(line, "line")
        except ValueError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


def _check_path(p: Path) -> None:
    """ConfigError when the log's path is not safe to write (see the module doc)."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ConfigError(f"JsonlSink path={str(p)!r} cannot be checked ({e}).") from None
    uid = os.geteuid()
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_uid != uid
                           or st.st_nlink != 1):
        what = ("a symlink" if stat.S_ISLNK(st.st_mode) else
                "not a regular file" if not stat.S_ISREG(st.st_mode) else
                f"owned by uid {st.st_uid}" if st.st_uid != uid else "a file with other names")
        raise ConfigError(f"JsonlSink path={str(p)!r} is {what}: memwatch writes its log only "
                          "to a file of its own; remove it or pass another path.")
    try:  # a missing folder is created private (mode 0700) when the log is opened
        pst = os.stat(p.parent)
    except OSError:
        return
    try:
        check_dir_stat(pst, str(p.parent))
    except UnsafePathError as e:
        raise ConfigError(f"JsonlSink path={str(p)!r}: {e}.") from None


def _origin() -> dict[str, Any]:
    """Where this file's records come from: host, local rank, world size and job id (launcher
    variables; the sample records carry the rank)."""
    from memwatch.bundle import host_name
    from memwatch.runtime.exchange import job_identity

    def _int(name: str, default: int) -> int:
        v = os.environ.get(name, "")
        return int(v) if v.isdigit() else default

    try:
        job = job_identity()["id"]
    except Exception:  # noqa: BLE001
        job = None
    return {"host": host_name(), "local_rank": _int("LOCAL_RANK", 0),
            "world_size": _int("WORLD_SIZE", 1), "job": job}
