r"""Reports of exported samples: a JsonlSink event log, or a CSV / JSON export.

:func:`from_export` reads what :class:`memwatch.sinks.JsonlSink` and :mod:`memwatch.bundle.export`
write (and CSV/JSONL rows with a ``step`` and metric columns) into a
:class:`memwatch.report.data.ReportData`, for ``memwatch report FILE`` and
:func:`memwatch.report.html.render_export`.

Example::

    >>> import os
    >>> from memwatch.report.exports import from_export
    >>> path = os.path.join(tmp, "run.csv")
    >>> with open(path, "w") as f:
    ...     _ = f.write("step,host.rss,memwatch/host.uss_gib\n1,1048576,0.5\n2,2097152,0.5\n")
    >>> d = from_export(path)
    >>> d.steps, d.values["host.rss"], d.values["host.uss"]
    ([1, 2], [1048576.0, 2097152.0], [536870912.0, 536870912.0])
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from memwatch.core.errors import MemwatchError
from memwatch.report.data import ReportData, finite

__all__ = ["from_export"]

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
            # Columnar (memwatch.bundle.export.to_json): {"samples": {"step": [...], key: [...]}}
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
    :mod:`memwatch.bundle.export`.

    Also accepted: JSONL or CSV rows with a ``step`` and metric columns named as in
    ``mw.latest()`` (``host.rss``, bytes) or as logger keys (``memwatch/host.rss_gib``,
    converted back to bytes). Raises :class:`memwatch.core.errors.MemwatchError` when the file
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
            d.limits.update({k: float(v) for k, v in rec["limits"].items() if finite(v)})
            continue
        step = rec.get("step", rec.get("trainer/global_step", rec.get("_step")))
        if kind != "sample" or finite(step) is None:
            continue
        row = by_step.setdefault(int(step), {})  # type: ignore[arg-type]
        metrics = rec["metrics"] if isinstance(rec.get("metrics"), dict) else rec
        for col, v in metrics.items():
            named = _metric_name(str(col))
            if named is not None and finite(v) is not None:
                row[named[0]] = float(v) * named[1]
    for f in d.findings:
        # An export carries no limits, but a verdict states the one it forecast against.
        ev = f.get("evidence")
        lim = finite(ev.get("limit_bytes")) if isinstance(ev, dict) else None
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
    d.set_series(steps, values)
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
