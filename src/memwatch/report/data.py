"""Everything a report shows, gathered from one of three sources into one shape.

:class:`ReportData` is built from a live run (:func:`from_run`), an OOM bundle
(:func:`from_bundle`) or a JSONL/CSV export (:func:`memwatch.report.exports.from_export`); the
HTML renderer only reads this object, so the three sources render the same way. Every builder is
defensive: a part whose data is missing or unreadable becomes a note in :attr:`ReportData.notes`
and an empty section, never an exception (a report must not fail because one section's data is
missing).

Example::

    >>> import memwatch
    >>> from memwatch.report.data import from_run
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp), signals=False) as mw:
    ...     for _ in range(5):
    ...         mw.step()
    ...     data = from_run(mw)
    >>> data.source, len(data.steps), "host.rss" in data.values
    ('live run', 5, True)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memwatch.core.errors import MemwatchError
from memwatch.core.untrusted import number

if TYPE_CHECKING:
    from memwatch.bundle import Bundle
    from memwatch.core.protocols import LiveRun

__all__ = ["CHART_METRICS", "ReportData", "epochs_in", "from_bundle", "from_run"]

#: Points per chart trace: more adds nothing a person can see and slows the browser.
MAX_POINTS = 1500
#: Most metrics a report charts (memwatch records a few dozen; each is a series of every step).
MAX_SERIES = 64
#: Windows whose minimum is a metric's floor (the memory still held between steps' peaks).
FLOOR_WINDOWS = 96
#: Byte metrics that get a chart, in this order, when present with data.
CHART_METRICS: tuple[str, ...] = (
    "device.allocated", "device.reserved", "device.active", "device.peak",
    "device.inactive_split", "device.process_used",
    "host.rss", "host.rss_anon", "host.rss_file", "host.rss_shmem", "host.uss", "host.pss",
    "host.swap",
    "workers.rss", "workers.uss", "workers.pss", "workers.max_uss",
)


@dataclasses.dataclass
class ReportData:
    """The report's content, independent of where it came from."""

    title: str
    source: str  # "live run", "bundle", "export"
    meta: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    headline: str | None = None
    exception: dict[str, Any] | None = None
    steps: list[int] = dataclasses.field(default_factory=list)
    values: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)
    epochs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    limits: dict[str, float] = dataclasses.field(default_factory=dict)
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    fullness: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: One entry per worker: {"index", "pids", "steps", "rss", "uss"} (live runs only).
    workers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    top_tensors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    census_note: str | None = None
    #: A bundle's killer: what held the memory that grew since the last check (a sentence,
    #: then one line per holder).
    killer: list[str] = dataclasses.field(default_factory=list)
    allocator_stats: dict[str, Any] | None = None
    snapshot: Any = None
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    files: dict[str, Any] = dataclasses.field(default_factory=dict)
    total_steps: int | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    cli_hint: str | None = None
    #: Per metric: (steps, floors), the minimum of each of FLOOR_WINDOWS windows of the full
    #: series (computed before the charts' max-downsampling, which would hide the floors).
    floors: dict[str, tuple[list[int], list[float]]] = dataclasses.field(default_factory=dict)
    #: The run's current verdicts (one per belief), when the source knows them
    #: (a live run: ``MemWatch.current_findings()``; a finished run: its ``summary.json``);
    #: None: the latest finding of each kind and metric stands for them.
    current: list[dict[str, Any]] | None = None
    #: Whether the run has epochs (None: judged from the data). A loop without epochs is told
    #: in steps and checks, never in epochs.
    has_epochs: bool | None = None

    def set_series(self, steps: list[int], values: dict[str, list[float | None]]) -> None:
        """The samples: floors from the full series, then the series downsampled for charts."""
        self.floors = window_floors(steps, values)
        self.steps, self.values = downsample(steps, values)


def epochs_in(d: ReportData) -> bool:
    """Whether the run of ``d`` has epochs: said by its source, else any epoch ended or any
    finding judged after epoch 0."""
    if d.has_epochs is not None:
        return d.has_epochs
    return bool(d.epochs) or any(isinstance(f.get("epoch"), int) and f["epoch"] > 0
                                 for f in d.findings)


def finite(v: Any) -> float | None:
    """``v`` as a finite float, else None (:func:`memwatch.core.untrusted.number`)."""
    return number(v)


def downsample(steps: list[int], values: dict[str, list[float | None]]) -> tuple[
        list[int], dict[str, list[float | None]]]:
    """At most MAX_POINTS per series: each window of k samples becomes its maximum.

    The maximum, not the floor or every k-th sample: a memory chart is read for how close it came
    to the limit, and thinning by stride would drop exactly the spikes that matter.
    """
    n = len(steps)
    if n <= MAX_POINTS:
        return steps, values
    k = math.ceil(n / MAX_POINTS)
    out_steps = [steps[min(i + k - 1, n - 1)] for i in range(0, n, k)]
    out: dict[str, list[float | None]] = {}
    for key, col in values.items():
        reduced: list[float | None] = []
        for i in range(0, n, k):
            w = [v for v in col[i:i + k] if v is not None]
            reduced.append(max(w) if w else None)
        out[key] = reduced
    return out_steps, out


def window_floors(steps: list[int], values: dict[str, list[float | None]],
                  windows: int = FLOOR_WINDOWS) -> dict[str, tuple[list[int], list[float]]]:
    """Each metric's floor per window of consecutive samples, at the window's middle step.

    The floor (not the mean) is what a leak keeps: the intra-step sawtooth of activations is
    gone from it, and the analyzer judges floors too.
    """
    n = len(steps)
    out: dict[str, tuple[list[int], list[float]]] = {}
    if n < 2:
        return out
    k = max(1, math.ceil(n / windows))
    for key, col in values.items():
        xs: list[int] = []
        ys: list[float] = []
        for i in range(0, n, k):
            w = [v for v in col[i:i + k] if v is not None]
            if w:
                xs.append(steps[min(i + k // 2, n - 1)])
                ys.append(min(w))
        if xs:
            out[key] = (xs, ys)
    return out


# --------------------------------------------------------------------------- live run
def from_run(mw: LiveRun) -> ReportData:
    """The report of a running (or closed) :class:`memwatch.MemWatch`."""
    d = ReportData(title="memwatch run report", source="live run")
    d.has_epochs = mw.epoch > 0
    d.meta = [("generated", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")),
              ("steps", f"{mw.step_count:,}"), ("checks", str(mw.checks))]
    if d.has_epochs:
        d.meta.append(("epochs", str(mw.epoch)))
    d.meta += [("rank", str(mw.rank.get("rank", 0))), ("pid", str(os.getpid()))]
    d.total_steps = mw.total_steps
    tl = mw.timeline
    if tl is None:
        d.notes.append("The run was never started: no samples.")
    else:
        try:
            n = len(tl)
            rows, steps, times = tl.recent(n)
            d.set_series([int(s) for s in steps],
                         {k: [finite(x) for x in rows[:, j]] for j, k in enumerate(tl.keys)})
            if tl.n_samples > n:
                d.notes.append(f"The ring keeps the last {n} of {tl.n_samples} samples; older "
                               "steps are summarised per epoch only.")
        except Exception as e:  # noqa: BLE001
            d.notes.append(f"Timeline unreadable ({type(e).__name__}: {e}).")
        try:
            d.epochs = [e.to_dict() for e in mw.epochs]
        except Exception as e:  # noqa: BLE001
            d.notes.append(f"Epoch summaries unreadable ({type(e).__name__}: {e}).")
    try:
        d.limits = {k: float(v) for k, v in mw.limits().items()}
    except Exception:  # noqa: BLE001
        pass
    d.findings = [f.to_dict() for f in mw.findings]
    if mw.checks:  # (before the first check there is no current verdict, not even "ok")
        d.current = [f.to_dict() for f in mw.current_findings()]
    d.workers = _live_workers(mw)
    d.fullness = _fullness_from(mw.latest(), d.limits)
    dev = mw.device
    if dev is not None and mw.running:
        # The allocator as it is now (segments, blocks, history when recorded): what a bundle
        # shows at a failure, for a run that is still alive.
        try:
            d.allocator_stats = {"memory_stats": dev.memory_stats()}
            snap = getattr(dev, "snapshot", None)
            d.snapshot = snap() if snap is not None else None
        except Exception as e:  # noqa: BLE001
            d.notes.append(f"Allocator state unavailable ({type(e).__name__}: {e}).")
    if mw.disabled:
        d.notes.extend(f"{k} was disabled during the run: {v}" for k, v in mw.disabled.items())
    bundles = list(getattr(mw.recorder, "bundles", []) or [])
    if bundles:
        d.meta.append(("bundles", ", ".join(str(b) for b in bundles[-3:])))
    return d


def _live_workers(mw: LiveRun) -> list[dict[str, Any]]:
    """Per-worker RSS/USS over steps, from the workers probe's bounded history."""
    probe = next((p for p in mw.probes if p.name == "workers"), None)
    tl = mw.timeline
    hist = list(getattr(probe, "history", []) or [])
    if probe is None or tl is None or not hist or len(tl) == 0:
        return []
    # Worker readings carry wall-clock times; map them to the step being trained then.
    import numpy as np

    offset = time.time() - time.monotonic()
    n = len(tl)
    _, steps, times = tl.recent(n)
    wall = times + offset
    by_index: dict[int, dict[str, Any]] = {}
    for s in hist:
        w = by_index.setdefault(int(s.index), {"index": int(s.index), "pids": set(),
                                               "steps": [], "rss": [], "uss": []})
        w["pids"].add(int(s.pid))
        w["steps"].append(int(np.interp(s.t, wall, steps)))
        w["rss"].append(float(s.rss))
        w["uss"].append(float(s.uss))
    out = []
    for i in sorted(by_index):
        w = by_index[i]
        w["pids"] = sorted(w["pids"])
        out.append(w)
    return out


def _fullness_from(latest: dict[str, float], limits: dict[str, float]) -> list[dict[str, Any]]:
    from memwatch.report.summary import SHOWN_METRICS

    rows = []
    for metric, limit in sorted(limits.items()):
        v = finite(latest.get(metric))
        if metric in SHOWN_METRICS and v is not None and limit and limit > 0:
            rows.append({"scope": metric.split(".")[0], "metric": metric, "value": v,
                         "limit": limit, "utilization": v / limit})
    return rows


# --------------------------------------------------------------------------- bundle
def from_bundle(bundle: Bundle, display_path: str | None = None) -> ReportData:
    """The report of an OOM bundle (raises :class:`memwatch.core.errors.BundleError` only for a
    corrupted manifest-level problem; a corrupted optional part becomes a note)."""
    from memwatch.report.summary import killer_lines, summarize

    s = summarize(bundle)
    m = s.manifest
    name = str(m.get("name", Path(bundle.path).name))
    d = ReportData(title=f"memwatch bundle {name}", source="bundle")
    cls = m.get("classification")
    kind = cls.get("kind") if isinstance(cls, dict) else cls
    d.meta = [("written", str(m.get("created_utc", "?"))), ("host", str(m.get("host", "?"))),
              ("rank", str(m.get("rank", "?"))), ("pid", str(m.get("pid", "?"))),
              ("trigger", str(m.get("trigger", "?"))), ("class", str(kind or "-")),
              ("step", str(m.get("step", "?")))]
    epoch = m.get("epoch")
    d.has_epochs = bool(s.epochs) or (isinstance(epoch, int) and epoch > 0)
    if d.has_epochs:
        d.meta.append(("epoch", str(epoch)))
    if m.get("pre_unwind"):
        d.meta.append(("captured", "before the stack unwound"))
    if m.get("reason"):
        d.meta.append(("reason", str(m["reason"])))
    d.headline = s.headline
    d.exception = s.exception
    d.fullness = s.fullness
    d.top_tensors = s.top_tensors
    d.census_note = s.census_note
    d.killer = killer_lines(s)
    d.findings = s.findings
    d.environment = s.environment
    d.files = dict(m.get("files") or {})
    d.epochs = s.epochs
    d.cli_hint = f"memwatch inspect {display_path or s.path}"
    memory = bundle.read_json("memory.json", {}) or {}
    if isinstance(memory, dict):
        d.limits = {k: float(v) for k, v in (memory.get("limits") or {}).items()
                    if finite(v) is not None}
    # The full timeline (not the summary's downsampled copy): charts downsample by max.
    steps: list[int] = []
    # Charted metrics: the header's first MAX_SERIES (memwatch records a few dozen): each is a
    # column every sample is read into, so a header of thousands would cost thousands per line.
    values: dict[str, list[float | None]] = {k: [] for k in s.keys[:MAX_SERIES]}
    if len(s.keys) > MAX_SERIES:
        d.notes.append(f"The timeline names {len(s.keys)} metrics: only the first {MAX_SERIES} "
                       "are charted.")
    for rec in bundle.timeline():
        if rec.get("type") == "sample" and isinstance(rec.get("step"), int):
            steps.append(rec["step"])
            for k in values:
                values[k].append(finite(rec.get(k)))
    d.set_series(steps, values)
    if not steps:
        d.notes.append("The bundle has no timeline samples (timeline.jsonl missing or empty).")
    if s.allocator:
        d.allocator_stats = s.allocator
    try:
        d.snapshot = bundle.snapshot()
    except MemwatchError as e:
        d.notes.append(f"snapshot.pickle not shown: {e}")
    trimmed = [t.get("file") for t in m.get("trimmed") or [] if isinstance(t, dict)]
    if trimmed:
        d.notes.append("Trimmed to fit the bundle size cap: " + ", ".join(map(str, trimmed)))
    for f, err in (m.get("errors") or {}).items():
        d.notes.append(f"{f} could not be written: {err}")
    return d
