"""What a training session leaves in its ``out_dir`` when it closes: the run's answer.

* ``report.html``: the verdict-first report ``memwatch report`` renders (the run's current
  verdicts as cards, its charts), so every run that ends, cleanly or not, leaves one that
  ``memwatch report OUT_DIR`` and a browser open;
* ``summary.json`` (:mod:`memwatch.bundle.run_summary`): the same answer for a machine — steps,
  checks, the current verdicts with holder and severity, the bundles written, how the run
  ended.

Within the costs memwatch keeps: the report's charts (plotly.js inlined, about 5 MB, ~0.05 s of
CPU to write) are drawn when ``run_report="full"``, or with ``"auto"`` when that work keeps memwatch
within its budget of the run (1% of its CPU time: a run of a few seconds or more); otherwise the
tables alone (a few KiB). A report over ``max_bundle_bytes`` is written without charts. Nothing
here raises: a failure logs one warning and the run ends as it would have.

Example::

    >>> import os, memwatch
    >>> from memwatch.bundle.run_summary import read_summary
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=tmp, signals=False) as mw:
    ...     for _ in range(20):
    ...         mw.step()
    >>> doc = read_summary(tmp)
    >>> doc["steps"], doc["exit"]["status"], doc["verdict"], os.path.isfile(mw.report_path)
    (20, 'completed', 'ok', True)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memwatch.bundle.paths import REPORT_FILE
from memwatch.bundle.run_summary import MAX_VERDICTS, verdict_entry, write_summary
from memwatch.core.costs import Costs
from memwatch.core.exiting import at_exit
from memwatch.core.safefs import open_dir, write_atomic
from memwatch.core.verdict_words import run_verdict

if TYPE_CHECKING:
    from memwatch.bundle.paths import OutputPaths
    from memwatch.core.protocols import LiveRun
    from memwatch.session.config import WatchConfig

__all__ = ["RENDER_CPU_S", "Answer", "Ending", "ending", "leave_answer"]

log = logging.getLogger("memwatch")

#: CPU seconds a report with charts costs to write (measured: 0.03-0.08 s, plotly.js inlined):
#: what ``run_report="auto"`` asks of the budget before drawing them.
RENDER_CPU_S = 0.05



@dataclasses.dataclass(frozen=True)
class Ending:
    """How a run ended: ``status`` ``"completed"``, ``"failed"`` (an exception ended it) or
    ``"interrupted"`` (Ctrl-C, a signal), the exception's type and its bundle."""

    status: str
    exception: str | None = None
    bundle: str | None = None


def ending(exc: BaseException | None) -> Ending:
    """The ending of a run closing while ``exc`` propagates (None: it completed)."""
    if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return Ending("completed")
    bundle = getattr(exc, "memwatch_bundle", None)
    status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    return Ending(status, f"{type(exc).__module__}.{type(exc).__qualname__}",
                  str(bundle) if bundle is not None else None)


def in_flight() -> BaseException | None:
    """The exception ending the run now: one propagating through ``close()`` (a ``finally:``,
    ``__exit__``), else the one the interpreter is exiting with (closed at exit)."""
    exc = sys.exc_info()[1]
    return exc if exc is not None else at_exit.exiting_with


def _utc(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def _peaks(mw: LiveRun) -> dict[str, float]:
    """Each metric's peak over the run: its epochs' peaks and the samples still in the ring."""
    tl = mw.timeline
    out: dict[str, float] = {}
    if tl is None:
        return out
    try:
        rows, _, _ = tl.recent(len(tl))
        for j, k in enumerate(tl.keys):
            vals = [float(v) for v in rows[:, j] if math.isfinite(v)]
            vals += [float(e.peak[j]) for e in mw.epochs if math.isfinite(e.peak[j])]
            if vals:
                out[k] = max(vals)
    except Exception:  # noqa: BLE001 - the peaks are a nicety of the summary
        pass
    return out


def _bundles(mw: LiveRun, root: Path) -> list[dict[str, Any]]:
    from memwatch.bundle import open_bundle

    out = []
    for p in list(getattr(mw.recorder, "bundles", []) or [])[-20:]:
        entry: dict[str, Any] = {"path": os.path.relpath(p, root), "trigger": None,
                                 "classification": None}
        try:
            m = open_bundle(p).manifest
            cls = m.get("classification")
            entry.update(trigger=m.get("trigger"),
                         classification=cls.get("kind") if isinstance(cls, dict) else cls)
        except Exception:  # noqa: BLE001 - deleted by retention since, or unreadable
            pass
        out.append(entry)
    return out


def summary_doc(mw: LiveRun, end: Ending, root: Path, report: str | None,
                stage: str = "train", started: float | None = None) -> dict[str, Any]:
    """The ``summary.json`` of ``mw`` (see ``docs/bundle-format.md``)."""
    now = time.time()
    current = mw.current_findings()
    rank = dict(mw.rank)
    epochs = mw.epoch > 0
    own = [f for f in current if not f.kind.startswith("rank_")]
    ranks = [f for f in current if f.kind.startswith("rank_")]
    doc = {
        "run_id": getattr(getattr(mw.recorder, "maker", None), "run_id", None),
        "started_utc": _utc(started if started is not None else now), "ended_utc": _utc(now),
        "ended_unix": now, "host": socket.gethostname(), "pid": os.getpid(),
        "rank": rank.get("rank", 0), "local_rank": rank.get("local_rank", 0),
        "world_size": rank.get("world_size", 1), "job": dict(mw.job or {}),
        "stage": stage, "steps": mw.step_count, "checks": mw.checks,
        "verdict": run_verdict(current),
        "verdicts": [verdict_entry(f, epochs) for f in own[-MAX_VERDICTS:]],
        "rank_verdicts": [verdict_entry(f, epochs) for f in ranks[-MAX_VERDICTS:]],
        "findings_total": len(mw.findings), "bundles": _bundles(mw, root),
        "exit": dataclasses.asdict(end), "report": report,
        "peaks": _peaks(mw), "limits": {k: float(v) for k, v in mw.limits().items()},
        "disabled": dict(mw.disabled),
    }
    if epochs:  # (a loop without epochs is told in steps and checks only: no such key)
        doc["epochs"] = mw.epoch
    return doc


def _report_html(mw: LiveRun, charts: bool, max_bytes: int) -> bytes:
    from memwatch.report.data import from_run
    from memwatch.report.html import render

    data = from_run(mw)
    if not charts:
        data.notes.insert(0, "Charts are left out (run_report='tables', or run_report='auto' "
                             "in a run this short: drawing them would take more than "
                             "memwatch's budget of it); MemWatch(run_report='full'), or "
                             "`memwatch run --report full`, draws them.")
        return render(data, with_charts=False).encode()
    html = render(data).encode()
    if len(html) > max_bytes:
        data.notes.insert(0, "Charts are left out: the report with them would be larger than "
                             "max_bundle_bytes.")
        html = render(data, with_charts=False).encode()
    return html


def leave_answer(mw: LiveRun, cfg: WatchConfig, root: Path, end: Ending, charts: bool,
                 started: float | None = None) -> tuple[Path | None, Path | None]:
    """Write ``report.html`` then ``summary.json`` into ``root`` (the session's ``out_dir``);
    their paths (None for one not written). Never raises."""
    report: Path | None = None
    summary: Path | None = None
    try:
        html = _report_html(mw, charts, cfg.max_bundle_bytes)
        fd = open_dir(root, create=True, share=cfg.share)
        try:
            write_atomic(fd, REPORT_FILE, html, share=cfg.share)
        finally:
            os.close(fd)
        report = root / REPORT_FILE
    except Exception as e:  # noqa: BLE001 - the run ends as it would have
        log.warning("memwatch: the run's report was not written (%s: %s)", type(e).__name__, e)
    try:
        doc = summary_doc(mw, end, root, REPORT_FILE if report else None, cfg.stage, started)
        summary = write_summary(root, doc, share=cfg.share)
    except Exception as e:  # noqa: BLE001
        log.warning("memwatch: summary.json was not written (%s: %s)", type(e).__name__, e)
    return report, summary


class Answer:
    """The part of a session that leaves its answer when it closes (see the module doc).

    Attributes:
        report_path, summary_path: what it wrote (None before the close, or when not written:
            ``run_report="none"``, an evaluation session, a failure to write).
    """

    def __init__(self, config: WatchConfig) -> None:
        self._config = config
        self._paths: OutputPaths | None = None
        self._started: float | None = None
        self.report_path: Path | None = None
        self.summary_path: Path | None = None

    def start(self, paths: OutputPaths) -> None:
        """Where the answer goes (the ``out_dir`` resolved at start)."""
        self._paths = paths
        self._started = time.time()

    def leave(self, mw: LiveRun, costs: Costs) -> None:
        """The session closed: its report and summary (training sessions only: an evaluation
        session's verdicts are the training session's to tell)."""
        cfg = self._config
        if self._paths is None or cfg.run_report == "none" or cfg.stage != "train":
            return
        mode = cfg.run_report
        charts = mode == "full" or (mode == "auto" and costs.allows(RENDER_CPU_S))
        self.report_path, self.summary_path = leave_answer(
            mw, cfg, self._paths.root, ending(in_flight()), charts, self._started)
