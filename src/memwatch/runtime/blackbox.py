"""The black box: a small record of the run, rewritten every few seconds, that survives SIGKILL.

The background sampler's thread (no thread of its own: every thread costs address space, which
runs under an address-space limit cannot spare) rewrites
``<out_dir>/blackbox/<host>-pid<pid>.json`` every ``every_s`` seconds (default 5; no more often
than the sampler's ``interval_s``): the latest sample, the last ``keep`` snapshots (one per
rewrite: ten minutes at the default), the latest findings, the memory cgroup and its OOM-kill
counter, the step and the epoch. Never per step, never on the training thread: ``mw.step()``
does not change. The file is written to a fresh temporary name (``O_EXCL``, relative to the
``blackbox/`` directory's descriptor, mode 0600) and renamed over the old one, so a kill
mid-write leaves the previous record whole and a symlink planted anywhere is never written
through; it stays a few hundred KB at most (bounded snapshots and findings). A clean ``close()``
removes it. Findings are redacted when they are born (:class:`memwatch.core.findings.Finding`),
the rest of the record at start. See :mod:`memwatch.bundle.blackbox` for how
records are judged.

At start, records in the same ``out_dir`` left by processes of this host that no longer exist
are reported once (a log warning naming how the run ended) and moved to ``blackbox/ended/``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
from typing import Any

from memwatch._version import __version__
from memwatch.bundle import blackbox as fmt
from memwatch.bundle.paths import OutputPaths
from memwatch.core.protocols import SessionView
from memwatch.core.redact import redact_obj
from memwatch.core.safefs import ensure_dir, modes, open_dir, write_atomic

__all__ = ["BlackBox", "report_previous"]

log = logging.getLogger("memwatch")

#: Findings kept in the record (the newest).
_FINDINGS = 20


def _finite(d: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float)) and math.isfinite(v)}


class BlackBox:
    """Keeps the record of one watched process up to date on disk (see the module doc)."""

    def __init__(self, view: SessionView, paths: OutputPaths, every_s: float = 5.0,
                 keep: int = 120, share: str = "private") -> None:
        self.view = view
        self.paths = paths
        self.share = modes(share).share
        self.path = fmt.record_path(paths.root)
        self._dir_fd = -1
        self.every_s = every_s
        self._snapshots: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()  # a rewrite and close() never interleave
        self._closed = False
        self._due = math.inf
        self._pid = os.getpid()
        self._static: dict[str, Any] = {}
        #: Rewrites done, bytes of the last one, and seconds the last one took.
        self.writes = 0
        self.last_bytes = 0
        self.last_write_s = 0.0

    def start(self) -> None:
        """Write the first record now; :meth:`tick` rewrites it from then on."""
        self._static = redact_obj({
            "schema": fmt.SCHEMA, "kind": "memwatch-blackbox", "memwatch": __version__,
            "host": socket.gethostname(), "pid": self._pid,
            "proc_start": fmt.process_start(self._pid), "boot_id": fmt.boot_id(),
            "started_unix": time.time(), "out_dir": self.paths.given,
            "rank": dict(self.view.rank), "job": dict(self.view.job or {}),
        })
        # The record's directory is held by a descriptor: swapping blackbox/ (or a parent) for
        # a symlink later changes nothing.
        out_fd = open_dir(str(self.paths.root), create=True, share=self.share, nofollow=False)
        try:
            self._dir_fd = ensure_dir(out_fd, fmt.BLACKBOX_SUBDIR, self.share)
        finally:
            os.close(out_fd)
        self.write()
        self._due = time.monotonic() + self.every_s

    def tick(self) -> None:
        """Rewrite the record when it is due (called by the background sampler after a pass)."""
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + self.every_s
        try:
            self.write()
        except Exception:  # noqa: BLE001 - the sampler must survive anything
            log.debug("memwatch: black box rewrite failed", exc_info=True)

    def document(self) -> dict[str, Any]:
        """The record as it would be written now."""
        v = self.view
        latest = _finite(v.latest())
        now = time.time()
        self._snapshots.append({"t": now, "step": v.step_count, "epoch": v.epoch,
                                "values": latest})
        findings = [f.to_dict() for f in list(v.findings)[-_FINDINGS:]]
        return {**self._static, "updated_unix": now, "step": v.step_count, "epoch": v.epoch,
                "latest": latest, "limits": _finite(v.limits()), "cgroup": v.cgroup_info(),
                "findings": findings, "samples": list(self._snapshots)}

    def write(self) -> None:
        """Rewrite the record now (atomically)."""
        with self._lock:
            if self._closed or os.getpid() != self._pid:
                return
            t0 = time.perf_counter()
            if self._dir_fd < 0:
                return
            data = json.dumps(self.document(), separators=(",", ":"), default=str).encode()
            write_atomic(self._dir_fd, self.path.name, data, share=self.share)
            self.writes += 1
            self.last_bytes = len(data)
            self.last_write_s = time.perf_counter() - t0

    def close(self) -> None:
        """A clean end: stop rewriting and remove the record (only the process that made it)."""
        with self._lock:
            self._closed = True
            fd, self._dir_fd = self._dir_fd, -1
            if os.getpid() != self._pid or fd < 0:
                return
            with contextlib.suppress(OSError):
                os.unlink(self.path.name, dir_fd=fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def forget_after_fork(self) -> None:
        """In a forked child: never touch the parent's record (a fresh lock: the parent's may
        have been held by the sampler thread at the fork)."""
        self._lock = threading.Lock()
        self._pid = -1
        fd, self._dir_fd = self._dir_fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def report_previous(paths: OutputPaths, share: str = "private") -> list[dict[str, Any]]:
    """Report, once, every run in the ``out_dir`` of ``paths`` that ended without a clean
    close: a warning each, and the record moved to ``blackbox/ended/``. Returns their records
    (with ``end``)."""
    reported = []
    with contextlib.suppress(OSError):
        fmt.clean_parts(paths.root)
    for path, doc in fmt.find_records(paths.root, ended=False):
        if doc.get("pid") == os.getpid() and doc.get("host") == socket.gethostname():
            continue
        end = fmt.judge(doc)
        if end["state"] != "unclean":
            continue
        try:
            dest = fmt.retire(path, doc, end, share=share)
        except OSError as e:
            log.debug("memwatch: could not move %s (%s)", path, e)
            dest = path
        log.warning("memwatch: previous run in %s: %s (%s); its last record: %s",
                    paths.given, fmt.summary_line(doc, end), end["why"], dest)
        reported.append({**doc, "end": end, "path": str(dest)})
    return reported
