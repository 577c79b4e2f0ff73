r"""Reports of exported samples: a JsonlSink event log, or a CSV / JSON export.

:func:`from_export` reads what :class:`memwatch.sinks.JsonlSink` and :mod:`memwatch.bundle.export`
write (and CSV/JSONL rows with a ``step`` and metric columns) into a
:class:`memwatch.report.data.ReportData`, for ``memwatch report FILE`` and
:func:`memwatch.report.html.render_export`.

An export is read like a bundle (:mod:`memwatch.bundle.reader`), trusting nothing in it: the
file named (followed if it is a symlink: you named it) and the rotated files beside a log
(:mod:`memwatch.core.logfiles`: ``<name>.<ASCII digits>``, regular files only, never through a
symlink, never a FIFO or device) are read with the bounded reader, a CSV or JSON export up to
:data:`MAX_EXPORT_BYTES` and a log's newest :data:`memwatch.core.logfiles.MAX_LOG_BYTES`; JSON
is parsed with the nesting cap and numbers come out finite
(:func:`memwatch.core.untrusted.loads_json`); every record is checked before it is used (a
finding or an epoch against :mod:`memwatch.bundle.schema`, a step, a rank and a metric value
for being numbers in range) and its strings made printable. What does not pass is skipped, and
counted in a note; what cannot be read at all is a :class:`memwatch.core.errors.MemwatchError`
of one line.

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
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memwatch.bundle.schema import EPOCH, FINDING, MAX_RANKS
from memwatch.core.errors import MemwatchError, UnsafePathError
from memwatch.core.logfiles import MAX_LOG_BYTES, bounded_lines, log_lines
from memwatch.core.safefs import open_regular, read_bounded
from memwatch.core.untrusted import loads_json, number, printable, sanitize
from memwatch.report.data import MAX_SERIES, ReportData, finite

__all__ = ["MAX_EXPORT_BYTES", "MAX_SERIES", "MAX_STEPS", "from_export"]

#: Largest CSV or JSON export read (one of a full default ring is about 25 MiB).
MAX_EXPORT_BYTES = MAX_LOG_BYTES
#: Most steps charted from one export (a full ring is 32,768; a 64 MiB log about 50,000): the
#: charts hold metrics x steps values.
MAX_STEPS = 200_000
#: Longest metric name kept.
_MAX_NAME = 200
#: Most distinct ranks remembered (only to say that a file mixes them).
_MAX_RANKS_SEEN = 64
_MAX_STEP = 1 << 63

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


def _jsonl_records(p: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    bad: Counter[str] = Counter()
    first: dict[str, str] = {}
    for q, n, line in log_lines(p, notes):
        if not line.strip():
            continue
        try:
            rec = loads_json(line, f"line {n}")
        except ValueError as e:
            bad[q.name] += 1
            first.setdefault(q.name, str(e))
            continue
        if isinstance(rec, dict):
            yield rec
    for name, k in bad.items():
        notes.append(f"{name}: {k} line(s) not JSON or not readable (skipped; a torn last line "
                     f"is normal after a crash), the first: {first[name][:200]}")


def _columns(cols: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Rows of a columnar export, built from the step column and the metric columns only, and
    only as far as a metric column reaches (work in proportion to the values, whatever the
    columns' lengths)."""
    steps = cols.get("step")
    if not isinstance(steps, list):
        return
    metric = sorted(((k, v) for k, v in cols.items() if isinstance(v, list) and v
                     and _metric_name(k) is not None), key=lambda kv: -len(kv[1]))
    metric = metric[:MAX_SERIES]
    alive = len(metric)
    for i, st in enumerate(steps):
        while alive and len(metric[alive - 1][1]) <= i:
            alive -= 1
        if not alive:
            return
        row = {"step": st}
        for k, v in metric[:alive]:
            row[k] = v[i]
        yield row


def _json_records(p: Path) -> Iterator[dict[str, Any]]:
    try:
        doc = loads_json(read_bounded(p, MAX_EXPORT_BYTES), str(p))
    except ValueError as e:
        raise MemwatchError(f"{p}: not a JSON document ({e})") from None
    if isinstance(doc, dict) and isinstance(doc.get("samples"), dict):
        # Columnar (memwatch.bundle.export.to_json): {"samples": {"step": [...], key: [...]}}
        yield from _columns(doc["samples"])
        epochs = doc.get("epochs")
        for ep in epochs if isinstance(epochs, list) else []:
            if isinstance(ep, dict):
                yield {**ep, "type": "epoch"}
        return
    if isinstance(doc, list):
        yield from (r for r in doc if isinstance(r, dict))
        return
    raise MemwatchError(f"{p}: expected a memwatch JSON export (with 'samples') or a list")


def _csv_value(v: str | None) -> Any:
    if v is None or v == "":
        return None
    if len(v) <= 20:  # 64-bit integers; longer digit strings are read as floats (or not at all)
        try:
            return int(v)
        except ValueError:
            pass
    try:
        return number(float(v))  # 1e999 or nan: no reading
    except ValueError:
        return v


def _csv_records(p: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    fd = open_regular(p)
    with open(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size > MAX_EXPORT_BYTES:
            raise UnsafePathError(f"{p} is {size} bytes, over the {MAX_EXPORT_BYTES}-byte cap "
                                  "for an export (not read)")
        skipped = [0]

        def text() -> Iterator[str]:
            for n, line in bounded_lines(f, MAX_EXPORT_BYTES, skipped):
                try:
                    yield line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise MemwatchError(f"{p}: line {n} is not UTF-8 text (byte {e.start})"
                                        ) from None

        rows = csv.reader(text())
        header = next(rows, None) or []
        for r in rows:
            yield {k: _csv_value(v) for k, v in zip(header, r, strict=False)}
        if skipped[0]:
            notes.append(f"{p.name}: {skipped[0]} line(s) too long to be rows (skipped)")


def _records(p: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    suffix = p.suffix.lower()
    if suffix == ".csv":
        return _csv_records(p, notes)
    if suffix == ".json":
        return _json_records(p)
    return _jsonl_records(p, notes)


def _step(v: Any) -> int | None:
    """A step: a whole number in range (a float step is truncated, as before)."""
    x = number(v)
    return int(x) if x is not None and -_MAX_STEP <= x <= _MAX_STEP else None


class _Reader:
    """What :func:`from_export` keeps of the records, each checked before it is used."""

    def __init__(self, d: ReportData) -> None:
        self.d = d
        self.by_step: dict[int, dict[str, float]] = {}
        self.ranks: set[int] = set()
        self.series: set[str] = set()
        self.dropped: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    def add(self, rec: dict[str, Any]) -> None:
        d = self.d
        kind = rec.get("event", rec.get("type", "sample"))
        rank = rec.get("rank")
        if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank <= MAX_RANKS \
                and len(self.ranks) < _MAX_RANKS_SEEN:
            self.ranks.add(rank)
        if kind == "epoch":
            self._epoch(rec)
        elif kind == "findings" and isinstance(rec.get("findings"), list):
            # One event per epoch end: its end_step marks the epoch boundary on the charts.
            end = rec.get("end_step")
            if end is not None and EPOCH.error({"end_step": end, "epoch": rec.get("epoch")}) \
                    is None:
                d.epochs.append({"epoch": rec.get("epoch"), "end_step": end})
            for f in rec["findings"]:
                self._finding(f)
        elif kind == "finding":
            self._finding({k: v for k, v in rec.items() if k not in ("type", "event")})
        elif kind == "bundle":
            if isinstance(rec.get("path"), str) and rec["path"]:
                d.meta.append(("bundle", sanitize(rec["path"], max_str=4096)))
        elif kind == "limits":
            lim = rec.get("limits")
            for k, v in (lim.items() if isinstance(lim, dict) else ()):
                x = number(v)
                if x is not None and len(k) <= _MAX_NAME:
                    d.limits[printable(k)] = x
        elif kind == "sample":
            self._sample(rec)

    def _epoch(self, rec: dict[str, Any]) -> None:
        if EPOCH.error(rec) is None:
            self.d.epochs.append(sanitize(rec))
        else:
            self.refused["epoch"] += 1

    def _finding(self, f: Any) -> None:
        if isinstance(f, dict) and FINDING.error(f) is None:
            self.d.findings.append(sanitize(f))
        else:
            self.refused["finding"] += 1

    def _sample(self, rec: dict[str, Any]) -> None:
        step = _step(rec.get("step", rec.get("trainer/global_step", rec.get("_step"))))
        if step is None:
            return
        metrics = rec["metrics"] if isinstance(rec.get("metrics"), dict) else rec
        row = self.by_step.get(step)
        for col, v in metrics.items():
            named = _metric_name(col) if isinstance(col, str) else None
            x = number(v)
            if named is None or x is None or len(named[0]) > _MAX_NAME:
                continue
            x = number(x * named[1])  # GiB of 1e300 is no number either
            name = printable(named[0])
            if x is None:
                continue
            if name not in self.series:
                if len(self.series) >= MAX_SERIES:
                    self.dropped["metric"] += 1
                    continue
                self.series.add(name)
            if row is None:
                if len(self.by_step) >= MAX_STEPS:
                    self.dropped["step"] += 1
                    return
                row = self.by_step[step] = {}
            row[name] = x

    def finish(self, p: Path) -> None:
        d = self.d
        for f in d.findings:
            # An export carries no limits, but a verdict states the one it forecast against.
            ev = f.get("evidence")
            lim = finite(ev.get("limit_bytes")) if isinstance(ev, dict) else None
            if lim and isinstance(f.get("metric"), str) and f["metric"] not in d.limits:
                d.limits[f["metric"]] = lim
        if len(self.ranks) > 1:
            shown = sorted(self.ranks)[:16]
            d.notes.append(f"The file mixes ranks {[str(r) for r in shown]}"
                           f"{' and more' if len(self.ranks) > len(shown) else ''}; their "
                           "samples are merged by step (export one file per rank for a per-rank "
                           "report).")
        for what, k in self.refused.items():
            d.notes.append(f"{k} {what} record(s) with fields of the wrong type or range were "
                           "left out")
        if self.dropped["metric"]:
            d.notes.append(f"More than {MAX_SERIES} metrics: {self.dropped['metric']} values of "
                           "the others were left out of the charts")
        if self.dropped["step"]:
            d.notes.append(f"More than {MAX_STEPS} steps: {self.dropped['step']} samples of later "
                           "steps were left out of the charts")
        if d.epochs and all("end_step" in e for e in d.epochs):
            d.epochs.sort(key=lambda e: e["end_step"] if isinstance(e["end_step"], int) else 0)
        steps = sorted(self.by_step)
        keys = sorted(self.series)
        d.set_series(steps, {k: [self.by_step[s].get(k) for s in steps] for k in keys})
        if not steps:
            d.notes.append(f"{p.name} holds no sample rows with a step and a memory metric.")
        d.notes.append("An export has no per-worker history, allocator snapshot or census: open "
                       "the run's OOM bundle (memwatch report BUNDLE) for those.")


def from_export(path: str | os.PathLike[str]) -> ReportData:
    """The report of an export of samples: the JSONL event log of
    :class:`memwatch.sinks.JsonlSink` (with its rotated files), or the CSV / JSON written by
    :mod:`memwatch.bundle.export`.

    Also accepted: JSONL or CSV rows with a ``step`` and metric columns named as in
    ``mw.latest()`` (``host.rss``, bytes) or as logger keys (``memwatch/host.rss_gib``,
    converted back to bytes). Raises :class:`memwatch.core.errors.MemwatchError` (one line) when
    the file cannot be read at all or is refused (see the module doc); rows it does not
    understand are skipped, and counted in the notes.
    """
    named = Path(path)
    p = Path(os.path.realpath(named)) if os.path.islink(named) else named
    d = ReportData(title=f"memwatch report of {printable(named.name)}", source="export")
    d.meta = [("file", printable(str(named))), ("generated",
              _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))]
    reader = _Reader(d)
    try:
        for rec in _records(p, d.notes):
            reader.add(rec)
    except MemwatchError:
        raise
    except (OSError, csv.Error) as e:
        raise MemwatchError(f"{named}: cannot read ({e})") from None
    reader.finish(named)
    return d
