"""Export a timeline to CSV or JSON, for people who analyse it elsewhere (pandas, a sheet).

Both take a :class:`memwatch.timeline.Timeline` (``mw.timeline``) or the :class:`memwatch.MemWatch`
itself, and write atomically (a temporary name, then ``os.replace``), private (mode 0600).

* CSV: one row per sample still in the ring (``capacity`` rows at most): ``step``, ``time_s``
  (seconds since the first exported sample), then one column per metric in bytes (counts for
  count metrics); a NaN reading is an empty cell.
* JSON: ``{"keys": [...], "samples": {"step": [...], "time_s": [...], "<metric>": [...]},
  "epochs": [EpochSummary.to_dict(), ...]}`` with ``null`` for NaN. The epochs cover the whole
  run even when the ring no longer holds its first samples.

Example::

    >>> import csv, json, os, memwatch
    >>> from memwatch.bundle.export import to_csv, to_json
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp)) as mw:
    ...     for _ in range(4):
    ...         mw.step()
    ...     _ = mw.end_epoch()
    >>> path = to_csv(mw.timeline, os.path.join(tmp, "timeline.csv"))
    >>> with open(path, newline="") as f:
    ...     rows = list(csv.DictReader(f))
    >>> len(rows), rows[0]["step"], "host.rss" in rows[0]
    (4, '1', True)
    >>> with open(to_json(mw, os.path.join(tmp, "timeline.json"))) as f:
    ...     doc = json.load(f)
    >>> len(doc["samples"]["step"]), len(doc["epochs"])
    (4, 1)
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from memwatch.core.errors import ConfigError
from memwatch.core.jsonable import jsonable

__all__ = ["to_csv", "to_json"]


def _timeline(obj: Any) -> Any:
    tl = getattr(obj, "timeline", obj)
    if tl is None or not hasattr(tl, "series") or not hasattr(tl, "keys"):
        raise ConfigError(f"{obj!r} is not a timeline; pass mw.timeline (after mw.start()).")
    return tl


def _columns(tl: Any) -> tuple[list[int], list[float], dict[str, list[float]]]:
    keys = list(tl.keys)
    steps: list[int] = []
    cols: dict[str, list[float]] = {}
    for k in keys:
        s, v = tl.series(k)
        steps = [int(x) for x in s]
        cols[k] = [float(x) for x in v]
    times = [float(x) for x in tl.times()]
    t0 = times[0] if times else 0.0
    return steps, [round(t - t0, 6) for t in times], cols


def _atomic_write(path: str | os.PathLike[str], write: Any, newline: str | None = None) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # mkstemp: O_EXCL, mode 0600, a random name; os.replace replaces a symlink planted at the
    # final name, never writes through it.
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".part", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            write(f)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def to_csv(timeline: Any, path: str | os.PathLike[str]) -> Path:
    """Write the samples still in the ring as CSV; returns the path."""
    tl = _timeline(timeline)
    steps, times, cols = _columns(tl)
    keys = list(cols)

    def write(f: Any) -> None:
        w = csv.writer(f)
        w.writerow(["step", "time_s", *keys])
        for i, step in enumerate(steps):
            vals = [cols[k][i] for k in keys]
            w.writerow([step, times[i], *("" if math.isnan(v) else repr(v) for v in vals)])

    return _atomic_write(path, write, newline="")


def to_json(timeline: Any, path: str | os.PathLike[str]) -> Path:
    """Write the ring's samples and every epoch summary as JSON; returns the path."""
    tl = _timeline(timeline)
    steps, times, cols = _columns(tl)
    doc = {
        "keys": list(cols),
        "samples": {"step": steps, "time_s": times, **cols},
        "epochs": [e.to_dict() for e in getattr(tl, "epochs", [])],
    }

    def write(f: Any) -> None:
        json.dump(jsonable(doc), f, allow_nan=False, separators=(",", ":"))

    return _atomic_write(path, write)
