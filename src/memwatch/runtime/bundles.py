"""What a bundle holds: the documents a failure's capture becomes, committed under ``<out_dir>/oom``
(:class:`BundleMaker`). The flight recorder (:mod:`.recorder`) decides when a bundle is written
and hands the capture here; this module writes what the on-disk format
(:mod:`memwatch.bundle.format`, ``docs/bundle-format.md``) says a bundle holds, renders its report,
and keeps the folder within its retention.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memwatch.bundle.documents import (
    Capture,
    environment,
    exception_doc,
    qualname,
    segments_summary,
    timeline_records,
)
from memwatch.bundle.format import BundleWriter, add_file, bundle_name, host_name, note_error
from memwatch.bundle.reader import Bundle, open_bundle
from memwatch.bundle.retention import enforce_retention
from memwatch.core.oom import PEER_FAILURE, Classification
from memwatch.core.protocols import SessionView
from memwatch.core.redact import redact_obj, redact_text
from memwatch.probes.procfs import address_space, rss_now
from memwatch.runtime.peers import job_fields
from memwatch.runtime.recorder_config import RecorderConfig

__all__ = ["BundleMaker", "ReportRenderer"]

#: Renders a bundle's ``report.html``: ``render(bundle, path, with_charts) -> html``. The
#: session hands the recorder one (the HTML report lives in a layer above the recorder's).
ReportRenderer = Callable[[Bundle, str, bool], str]

log = logging.getLogger("memwatch")


class BundleMaker:
    """Writes the bundles of one session's flight recorder.

    Args:
        config: the recorder's options (limits, report mode, who may read).
        view: the session's read-only view (rank, job, step, cgroup, workers' last readings).
        oom_dir: where bundles go (``<out_dir>/oom``); ``end_dir``: where the end-of-run bundles
            a sink asks for at a clean close go (not failures: ``<out_dir>/end_of_run``).
        render_report: renders ``report.html`` (None: no report in bundles).
        ranks: returns ``ranks.json``'s content (rank 0 of a distributed run) or None.
    """

    def __init__(self, config: RecorderConfig, view: SessionView, oom_dir: Path, *,
                 render_report: ReportRenderer | None = None,
                 ranks: Callable[[], dict[str, Any] | None] | None = None,
                 end_dir: Path | None = None) -> None:
        self.config = config
        self.view = view
        self.oom_root = oom_dir
        self.end_root = end_dir or oom_dir
        self._render_report = render_report
        self._ranks = ranks
        #: Names this recorder's bundles in their manifests: retention deletes only those.
        self.run_id = secrets.token_hex(8)
        #: The environment that does not change during the run (taken at start).
        self.static_env: dict[str, Any] = {}

    def cgroup_info(self) -> dict[str, Any] | None:
        try:
            return self.view.cgroup_info()
        except Exception:  # noqa: BLE001 - never in the way of a bundle
            return None

    def _cgroup_doc(self, cls: Classification | None) -> dict[str, Any] | None:
        """The cgroup at the failure, and the killed worker's last reading when one was."""
        info = self.cgroup_info()
        if info is None:
            return None
        now = info.pop("oom_kills", None)
        doc: dict[str, Any] = {**info, "oom_kills_now": now}
        pid = cls.numbers.get("worker_pid") if cls is not None else None
        if pid is not None:
            doc["killed_worker"] = self.view.worker_reading(pid)
        return doc

    def write(self, trigger: str, reason: str | None, exc: BaseException | None,
              cls: Classification | None, cap: Capture,
              history_on: bool) -> tuple[Path, dict[str, Any]]:
        """Write and commit one bundle of ``cap``; its path and committed manifest. Raises
        when it could not be written (nothing half-written is left)."""
        w: BundleWriter | None = None
        try:
            v = self.view
            name = bundle_name(cap.wall, v.rank.get("rank", 0), os.getpid())
            root = self.end_root if trigger == "end_of_run" else self.oom_root
            w = BundleWriter(root, name, share=self.config.share)
            self._documents(w, reason, exc, cls, cap, history_on)
            manifest = self._manifest(trigger, reason, exc, cls, cap)
            w.trim(self.config.max_bundle_bytes)
            path = w.commit(manifest)
            w = None
        finally:
            if w is not None:
                w.abort()
        # The evidence is on disk; the rendering comes after it (bundle.format.add_file).
        self._write_report(path, manifest)
        try:
            enforce_retention(root, self.config.max_bundles,
                              self.config.max_total_bytes, run_id=self.run_id, keep=path)
        except OSError as e:
            log.warning("memwatch: bundle retention failed (%s)", e)
        return path, manifest

    def _documents(self, w: BundleWriter, reason: str | None, exc: BaseException | None,
                   cls: Classification | None, cap: Capture, history_on: bool) -> None:
        v = self.view
        if exc is not None:
            w.write_json("exception.json", exception_doc(exc, cls))
        elif cap.observer is not None:
            w.write_json("exception.json", {
                "type": None, "message": None, "classification": "cuda_oom",
                "numbers": {k: val for k, val in cap.observer.items() if k != "device"},
                "traceback": None, "note": reason,
            })
        w.write_json("memory.json", {
            "latest": cap.latest, "limits": cap.limits, "observer": cap.observer,
            "host_rss_at_write": rss_now(), "address_space": address_space(),
            "captured_at_unix": cap.wall,
            "captured_on_thread": cap.thread, "capture_errors": cap.errors,
            "cgroup": self._cgroup_doc(cls),
        })
        w.write_json("environment.json", environment(self.static_env, v.rank, history_on))
        w.write_json("findings.json", redact_obj(cap.findings))
        w.write_jsonl("timeline.jsonl", timeline_records(cap))
        if cap.census is not None:
            w.write_json("census.json", redact_obj(cap.census))
        ranks = self._ranks() if self._ranks is not None else None
        if ranks is not None:
            w.write_json("ranks.json", redact_obj(ranks))
        if cap.memory_stats is not None or cap.snapshot is not None:
            w.write_json("allocator.json", {
                "memory_stats": cap.memory_stats,
                "segments_summary": segments_summary(cap.snapshot),
            })
        if cap.snapshot is not None:
            w.write_pickle("snapshot.pickle", redact_obj(cap.snapshot))

    def _manifest(self, trigger: str, reason: str | None, exc: BaseException | None,
                  cls: Classification | None, cap: Capture) -> dict[str, Any]:
        v = self.view
        return {
            "created_utc": _dt.datetime.fromtimestamp(cap.wall, _dt.timezone.utc)
            .isoformat(timespec="seconds"),
            "created_unix": cap.wall,
            "trigger": trigger,
            "reason": redact_text(reason) if reason else None,
            "classification": cls.kind if cls else ("cuda_oom" if cap.observer else None),
            "exception_type": qualname(type(exc)) if exc is not None else None,
            "pre_unwind": cap.pre_unwind,
            "host": host_name(),
            "pid": os.getpid(),
            **job_fields(v.rank, v.job, cls.kind if cls else None, trigger),
            "run_id": self.run_id,
            "step": v.step_count,
            "epoch": v.epoch,
        }

    def report_mode(self, trigger: str, kind: str | None = None) -> str:
        """What report.html a bundle of ``trigger`` (and classification ``kind``) gets: "full",
        "tables" or "none"."""
        mode = self.config.report
        if mode != "auto":
            return mode
        many = self.view.rank.get("world_size", 1) > 1  # every survivor of a job writes one
        return "tables" if many and (trigger == "signal" or kind == PEER_FAILURE) else "full"

    def _write_report(self, path: Path, manifest: Mapping[str, Any]) -> None:
        """Render report.html into the committed bundle at ``path`` (never raises)."""
        mode = self.report_mode(str(manifest.get("trigger")), manifest.get("classification"))
        if mode == "none" or self._render_report is None:
            return
        share = self.config.share
        try:
            html = self._render_report(open_bundle(path), str(path), mode == "full")
            add_file(path, "report.html", html, self.config.max_bundle_bytes, share=share)
        except Exception as e:  # noqa: BLE001
            try:
                note_error(path, "report.html", f"{type(e).__name__}: {e}", share=share)
            except Exception:  # noqa: BLE001
                log.warning("memwatch: report.html not written (%s: %s)", type(e).__name__, e)
