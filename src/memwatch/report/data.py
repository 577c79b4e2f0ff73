"""Everything a report shows, gathered from one of three sources into one shape.

:class:`ReportData` is built from a live run (:func:`from_run`), an OOM bundle
(:func:`from_bundle`) or a JSONL/CSV export (:func:`from_export`); the HTML renderer only reads
this object, so the three sources render the same way. Every builder is defensive: a part whose
data is missing or unreadable becomes a note in :attr:`ReportData.notes` and an empty section,
never an exception (a report must not fail because one section's data is missing).

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

import csv
import dataclasses
import datetime as _dt
import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memwatch.errors import MemwatchError

if TYPE_CHECKING:
    from memwatch.bundle import Bundle
    from memwatch.session import MemWatch

__all__ = ["ReportData", "TrendLine", "fit_trend", "from_bundle", "from_export", "from_run"]

#: Points per chart trace: more adds nothing a person can see and slows the browser.
MAX_POINTS = 1500
#: Byte metrics that get a chart, in this order, when present with data.
CHART_METRICS: tuple[str, ...] = (
    "device.allocated", "device.reserved", "device.active", "device.peak",
    "device.inactive_split", "device.process_used",
    "host.rss", "host.uss", "host.pss", "host.swap",
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
    allocator_stats: dict[str, Any] | None = None
    snapshot: Any = None
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    files: dict[str, Any] = dataclasses.field(default_factory=dict)
    total_steps: int | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    cli_hint: str | None = None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _downsample(steps: list[int], values: dict[str, list[float | None]]) -> tuple[
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


# --------------------------------------------------------------------------- live run
def from_run(mw: MemWatch) -> ReportData:
    """The report of a running (or closed) :class:`memwatch.MemWatch`."""
    d = ReportData(title="memwatch run report", source="live run")
    d.meta = [("generated", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")),
              ("steps", str(mw.step_count)), ("epochs", str(mw.epoch)),
              ("rank", str(mw.rank.get("rank", 0))), ("pid", str(os.getpid()))]
    d.total_steps = mw.total_steps
    tl = mw.timeline
    if tl is None:
        d.notes.append("The run was never started: no samples.")
    else:
        try:
            n = len(tl)
            rows, steps, times = tl._rows(tl.n_samples - n, tl.n_samples)
            d.steps = [int(s) for s in steps]
            d.values = {k: [_num(x) for x in rows[:, j]] for j, k in enumerate(tl.keys)}
            if tl.n_samples > n:
                d.notes.append(f"The ring keeps the last {n} of {tl.n_samples} samples; older "
                               "steps are summarised per epoch only.")
            d.steps, d.values = _downsample(d.steps, d.values)
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


def _live_workers(mw: MemWatch) -> list[dict[str, Any]]:
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
    _, steps, times = tl._rows(tl.n_samples - n, tl.n_samples)
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
        v = _num(latest.get(metric))
        if metric in SHOWN_METRICS and v is not None and limit and limit > 0:
            rows.append({"scope": metric.split(".")[0], "metric": metric, "value": v,
                         "limit": limit, "utilization": v / limit})
    return rows


# --------------------------------------------------------------------------- bundle
def from_bundle(bundle: Bundle, display_path: str | None = None) -> ReportData:
    """The report of an OOM bundle (raises :class:`memwatch.errors.BundleError` only for a
    corrupted manifest-level problem; a corrupted optional part becomes a note)."""
    from memwatch.report.summary import summarize

    s = summarize(bundle)
    m = s.manifest
    name = str(m.get("name", Path(bundle.path).name))
    d = ReportData(title=f"memwatch bundle {name}", source="bundle")
    cls = m.get("classification")
    kind = cls.get("kind") if isinstance(cls, dict) else cls
    d.meta = [("written", str(m.get("created_utc", "?"))), ("host", str(m.get("host", "?"))),
              ("rank", str(m.get("rank", "?"))), ("pid", str(m.get("pid", "?"))),
              ("trigger", str(m.get("trigger", "?"))), ("class", str(kind or "-")),
              ("step", str(m.get("step", "?"))), ("epoch", str(m.get("epoch", "?")))]
    if m.get("pre_unwind"):
        d.meta.append(("captured", "before the stack unwound"))
    if m.get("reason"):
        d.meta.append(("reason", str(m["reason"])))
    d.headline = s.headline
    d.exception = s.exception
    d.fullness = s.fullness
    d.top_tensors = s.top_tensors
    d.census_note = s.census_note
    d.findings = s.findings
    d.environment = s.environment
    d.files = dict(m.get("files") or {})
    d.epochs = s.epochs
    d.cli_hint = f"memwatch inspect {display_path or s.path}"
    memory = bundle.read_json("memory.json", {}) or {}
    if isinstance(memory, dict):
        d.limits = {k: float(v) for k, v in (memory.get("limits") or {}).items()
                    if _num(v) is not None}
    # The full timeline (not the summary's downsampled copy): charts downsample by max.
    steps: list[int] = []
    values: dict[str, list[float | None]] = {k: [] for k in s.keys}
    for rec in bundle.timeline():
        if rec.get("type") == "sample" and isinstance(rec.get("step"), int):
            steps.append(rec["step"])
            for k in values:
                values[k].append(_num(rec.get(k)))
    d.steps, d.values = _downsample(steps, values)
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


# --------------------------------------------------------------------------- exports
_LOGKEY_UNITS = {"_gib": float(1 << 30), "_mib": float(1 << 20), "_kib": float(1 << 10),
                 "_bytes": 1.0}


def _metric_name(col: str) -> tuple[str, float] | None:
    """``host.rss`` -> (host.rss, 1); ``memwatch/host.rss_gib`` -> (host.rss, 2**30)."""
    name = col
    if name.startswith("memwatch/"):
        name = name[len("memwatch/"):]
        if "/" in name:  # memwatch/val/..., memwatch/findings/...: not training-step memory
            return None
    scale = 1.0
    for suffix, mult in _LOGKEY_UNITS.items():
        if name.endswith(suffix):
            name, scale = name[: -len(suffix)], mult
            break
    if "." not in name or name.split(".")[0] not in ("device", "host", "workers"):
        return None
    return name, scale


def _export_files(p: Path) -> list[Path]:
    """``p`` and, for a rotated JSONL log, its older files (``p.N`` ... ``p.1``) first."""
    rotated = [q for q in p.parent.glob(p.name + ".*") if q.suffix[1:].isdigit()]
    return sorted(rotated, key=lambda q: -int(q.suffix[1:])) + [p]


def _read_export(p: Path, notes: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if p.suffix.lower() == ".csv":
        with open(p, encoding="utf-8", newline="") as f:
            for r in csv.DictReader(f):
                rows.append({k: _csv_value(v) for k, v in r.items() if k is not None})
        return rows
    if p.suffix.lower() == ".json":
        with open(p, encoding="utf-8") as f:
            try:
                doc = json.load(f)
            except ValueError as e:
                raise MemwatchError(f"{p}: not a JSON document ({e})") from None
        if isinstance(doc, dict) and isinstance(doc.get("samples"), dict):
            # Columnar (memwatch.sinks.export.to_json): {"samples": {"step": [...], key: [...]}}
            cols = doc["samples"]
            steps = cols.get("step") or []
            for i, st in enumerate(steps):
                rows.append({"step": st, **{k: v[i] for k, v in cols.items()
                                            if isinstance(v, list) and i < len(v)}})
            rows.extend({"type": "epoch", **e} for e in doc.get("epochs") or []
                        if isinstance(e, dict))
            return rows
        if isinstance(doc, list):
            return [r for r in doc if isinstance(r, dict)]
        raise MemwatchError(f"{p}: expected a memwatch JSON export (with 'samples') or a list")
    for q in _export_files(p):
        with open(q, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    notes.append(f"{q.name} line {lineno} is not JSON (skipped; a torn last "
                                 "line is normal after a crash)")
                    continue
                if isinstance(rec, dict):
                    rows.append(rec)
    return rows


def from_export(path: str | os.PathLike[str]) -> ReportData:
    """The report of an export of samples: the JSONL event log of
    :class:`memwatch.sinks.JsonlSink` (with its rotated files), or the CSV / JSON written by
    :mod:`memwatch.sinks.export`.

    Also accepted: JSONL or CSV rows with a ``step`` and metric columns named as in
    ``mw.latest()`` (``host.rss``, bytes) or as logger keys (``memwatch/host.rss_gib``,
    converted back to bytes). Raises :class:`memwatch.errors.MemwatchError` when the file
    cannot be read at all; rows it does not understand are skipped.
    """
    p = Path(path)
    d = ReportData(title=f"memwatch report of {p.name}", source="export")
    d.meta = [("file", str(p)), ("generated",
                                 _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))]
    try:
        rows = _read_export(p, d.notes)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise MemwatchError(f"{p}: cannot read ({e})") from None
    by_step: dict[int, dict[str, float | None]] = {}
    ranks: set[Any] = set()
    for rec in rows:
        kind = rec.get("event", rec.get("type", "sample"))
        if "rank" in rec:
            ranks.add(rec["rank"])
        if kind == "epoch":
            d.epochs.append(rec)
            continue
        if kind == "findings" and isinstance(rec.get("findings"), list):
            # One event per epoch end: its end_step marks the epoch boundary on the charts.
            if isinstance(rec.get("end_step"), int):
                d.epochs.append({"epoch": rec.get("epoch"), "end_step": rec["end_step"]})
            d.findings.extend(f for f in rec["findings"] if isinstance(f, dict))
            continue
        if kind == "finding":
            d.findings.append({k: v for k, v in rec.items() if k not in ("type", "event")})
            continue
        if kind == "bundle" and rec.get("path"):
            d.meta.append(("bundle", str(rec["path"])))
            continue
        if kind == "limits" and isinstance(rec.get("limits"), dict):
            d.limits.update({k: float(v) for k, v in rec["limits"].items() if _num(v)})
            continue
        step = rec.get("step", rec.get("trainer/global_step", rec.get("_step")))
        if kind != "sample" or _num(step) is None:
            continue
        row = by_step.setdefault(int(step), {})  # type: ignore[arg-type]
        metrics = rec["metrics"] if isinstance(rec.get("metrics"), dict) else rec
        for col, v in metrics.items():
            named = _metric_name(str(col))
            if named is not None and _num(v) is not None:
                row[named[0]] = float(v) * named[1]
    for f in d.findings:
        # An export carries no limits, but a verdict states the one it forecast against.
        ev = f.get("evidence")
        lim = _num(ev.get("limit_bytes")) if isinstance(ev, dict) else None
        if lim and isinstance(f.get("metric"), str) and f["metric"] not in d.limits:
            d.limits[f["metric"]] = lim
    if len(ranks) > 1:
        d.notes.append(f"The file mixes ranks {sorted(map(str, ranks))}; their samples are merged "
                       "by step (export one file per rank for a per-rank report).")
    if d.epochs and all("end_step" in e for e in d.epochs):
        d.epochs.sort(key=lambda e: e["end_step"] if isinstance(e["end_step"], int) else 0)
    keys = sorted({k for r in by_step.values() for k in r})
    steps = sorted(by_step)
    values = {k: [by_step[s].get(k) for s in steps] for k in keys}
    d.steps, d.values = _downsample(steps, values)
    if not steps:
        d.notes.append(f"{p.name} holds no sample rows with a step and a memory metric.")
    d.notes.append("An export has no per-worker history, allocator snapshot or census: open the "
                   "run's OOM bundle (memwatch report BUNDLE) for those.")
    return d


def _csv_value(v: str | None) -> Any:
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


# --------------------------------------------------------------------------- trends
@dataclasses.dataclass
class TrendLine:
    """A fitted line over a metric's held memory and, when it grows, its forecast.

    Example::

        >>> from memwatch.report.data import ReportData, fit_trend
        >>> steps = list(range(1, 201))
        >>> d = ReportData(title="t", source="export", steps=steps,
        ...                values={"host.rss": [2**30 + s * 2**20 for s in steps]},
        ...                limits={"host.rss": 4 * 2**30})
        >>> t = fit_trend(d, "host.rss")
        >>> t.significant, t.slope == 2**20, round(t.limit_step)
        (True, True, 3072)
    """

    metric: str
    x0: float
    x1: float
    y0: float
    y1: float
    slope: float  # bytes per step
    source: str  # "analyzer" (a finding's bytes_per_step) or "fit" (Theil-Sen on floors)
    significant: bool
    limit: float | None = None
    limit_step: float | None = None  # where the line reaches the limit, when it does

    def describe(self) -> str:
        from memwatch.units import fmt_bytes

        if not self.significant:
            return "no significant growth of the memory held"
        how = ("the analyzer's verdict" if self.source == "analyzer"
               else "Theil-Sen fit on the floors after the first epoch")
        s = f"{fmt_bytes(self.slope)}/step ({how})"
        if self.limit_step is not None and self.limit is not None:
            s += (f"; reaches the {fmt_bytes(self.limit)} limit near step "
                  f"{int(self.limit_step):,}")
        return s


def fit_trend(d: ReportData, metric: str) -> TrendLine | None:
    """Theil-Sen on bucket floors of ``metric`` (warm-up epoch dropped), or None."""
    import numpy as np

    from memwatch.analysis.trend import trend_test

    col = d.values.get(metric)
    if not col or len(d.steps) < 8:
        return None
    x = np.asarray(d.steps, dtype=np.float64)
    y = np.asarray([np.nan if v is None else v for v in col], dtype=np.float64)
    # Drop the first epoch (warm-up: the analyzer does not judge it either) when more follow.
    if len(d.epochs) >= 2:
        first_end = d.epochs[0].get("end_step")
        if isinstance(first_end, (int, float)) and (x > first_end).sum() >= 8:
            keep = x > first_end
            x, y = x[keep], y[keep]
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(y) < 8:
        return None
    nb = min(128, len(y))
    edges = np.linspace(0, len(y), nb + 1).astype(np.int64)
    floors = np.fmin.reduceat(y, edges[:-1])
    mids = x[(edges[:-1] + edges[1:] - 1) // 2]
    tr = trend_test(mids, floors)
    # Statistically significant is not enough: RSS creeping by a few hundred bytes per step is
    # real but harmless. Same magnitude floors as the analyzer: the fitted rise must exceed
    # 256 KiB, 0.02% of the level and four times the floors' noise.
    rise = tr.slope * float(mids[-1] - mids[0])
    level = float(np.nanmedian(floors))
    big = rise > max(256 * 1024, 2e-4 * abs(level), 4 * tr.noise)
    slope, significant, source = tr.slope, bool(tr.increasing() and big), "fit"
    for f in reversed(d.findings):
        bps = _num(f.get("bytes_per_step"))
        if f.get("metric") == metric and f.get("kind") in ("leak", "near_oom") and bps:
            slope, significant, source = bps, True, "analyzer"
            break
    x0, x1 = float(mids[0]), float(mids[-1])
    y1 = float(tr.intercept + tr.slope * x1)
    y0 = y1 - slope * (x1 - x0)
    line = TrendLine(metric, x0, x1, y0, y1, float(slope), source, bool(significant))
    limit = _num(d.limits.get(metric))
    if limit and limit > 0:
        line.limit = limit
        if significant and slope > 0 and y1 < limit:
            line.limit_step = x1 + (limit - y1) / slope
    return line
