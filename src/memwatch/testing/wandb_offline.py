"""Read an offline W&B run back from its directory: what memwatch wrote, without a server.

An offline run (``WANDB_MODE=offline``) keeps everything in ``wandb/offline-run-*/``: the
``run-<id>.wandb`` transaction log (history rows, summary updates, config, metric definitions,
artifact manifests, alerts) and the media files under ``files/media`` (tables are JSON files
under ``files/media/table``). :func:`read_offline_run` decodes both, so tests and users can check
that the panels' data is there before ``wandb sync``.

The log format (as written by wandb 0.17 to 0.31): a 7-byte header (``:W&B``, a 2-byte magic,
a version byte), then 32 KiB blocks of records, each with a 7-byte header (CRC-32 of type and
data, little-endian length, type: 1 full, 2 first, 3 middle, 4 last); the payloads are
``wandb.proto.wandb_internal_pb2.Record`` messages. It needs the ``wandb`` package (for the
protobuf classes).

Example::

    >>> import os, wandb
    >>> from memwatch.testing.wandb_offline import read_offline_run
    >>> os.environ["WANDB_MODE"] = "offline"
    >>> run = wandb.init(project="memwatch-demo", dir=str(tmp))
    >>> run.log({"memwatch/host.rss_gib": 1.5})
    >>> run.finish()
    >>> data = read_offline_run(run.dir)  # files/ or the run directory itself
    >>> [row["memwatch/host.rss_gib"] for row in data.history]
    [1.5]
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["OfflineRun", "read_offline_run", "records"]

_HEADER = b":W&B"
_BLOCK = 32768
_REC_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclasses.dataclass
class OfflineRun:
    """What an offline run holds, decoded."""

    path: Path
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    artifacts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    alerts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    record_types: dict[str, int] = dataclasses.field(default_factory=dict)

    def tables(self, key: str) -> list[dict[str, Any]]:
        """Every table logged under ``key`` (``{"columns": [...], "data": [[...]]}``), in order."""
        out = []
        for row in self.history:
            ref = row.get(key)
            if isinstance(ref, dict) and str(ref.get("path", "")).endswith(".table.json"):
                with open(self.path / "files" / ref["path"], encoding="utf-8") as f:
                    out.append(json.load(f))
        return out

    def summary_table(self, key: str) -> dict[str, Any] | None:
        """The table held in the run's summary under ``key`` (its last version), or None."""
        ref = self.summary.get(key)
        if not (isinstance(ref, dict) and str(ref.get("path", "")).endswith(".table.json")):
            return None
        with open(self.path / "files" / ref["path"], encoding="utf-8") as f:
            doc: dict[str, Any] = json.load(f)
        return doc

    def series(self, key: str, step_key: str = "memwatch/step") -> list[tuple[Any, Any]]:
        """``(step, value)`` of every history row holding ``key``."""
        return [(row.get(step_key), row[key]) for row in self.history if key in row]


def records(path: str | Path) -> Iterator[bytes]:
    """The raw record payloads of a ``.wandb`` transaction log (CRCs checked)."""
    data = Path(path).read_bytes()
    if data[:4] != _HEADER:
        raise ValueError(f"{path} is not a W&B transaction log (header {data[:7]!r})")
    pos, pending = 7, b""
    while pos + _REC_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _REC_HEADER:
            pos += left  # the rest of a block too short for a header is padding
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + _REC_HEADER])
        if crc == 0 and length == 0 and kind == 0:
            pos += left  # zero padding to the end of the block
            continue
        chunk = data[pos + _REC_HEADER:pos + _REC_HEADER + length]
        if len(chunk) < length:
            break  # a record still being written (the log of a live run)
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: bad checksum at offset {pos}")
        pos += _REC_HEADER + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def _value(item: Any) -> Any:
    try:
        return json.loads(item.value_json)
    except ValueError:
        return item.value_json


def _set_nested(d: dict[str, Any], item: Any) -> None:
    # History items arrive flattened ("memwatch/findings_table" + "path"); keys with a "/" in
    # their own name come as one nested_key element, sub-fields as further elements.
    keys = list(item.nested_key) or [item.key]
    cur = d
    for k in keys[:-1]:
        nxt = cur.get(k)
        if not isinstance(nxt, dict):
            nxt = cur[k] = {}
        cur = nxt
    cur[keys[-1]] = _value(item)


def _run_dir(path: str | Path) -> Path:
    p = Path(path)
    if p.name == "files":
        p = p.parent
    if not list(p.glob("*.wandb")):
        found = sorted(p.glob("wandb/offline-run-*")) + sorted(p.glob("offline-run-*"))
        if found:
            p = found[-1]
    return p


def read_offline_run(path: str | Path, wait_s: float = 60.0) -> OfflineRun:
    """Decode an offline run directory (or its ``files/``, or a ``WANDB_DIR`` holding one run).

    wandb's writer is a separate process that may still be flushing for a moment after
    ``run.finish()``: the log is re-read until its exit record is there, for up to ``wait_s``.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = _run_dir(path)
    deadline = time.monotonic() + wait_s
    while True:
        logs = sorted(run_dir.glob("*.wandb"))
        if not logs:
            if time.monotonic() < deadline:  # the writer may not have created it yet
                time.sleep(0.1)
                continue
            raise FileNotFoundError(f"no .wandb transaction log under {run_dir}")
        out = OfflineRun(path=run_dir)
        done = False
        for raw in records(logs[-1]):
            r = pb.Record()  # type: ignore[attr-defined]
            r.ParseFromString(raw)
            kind = r.WhichOneof("record_type") or ""
            out.record_types[kind] = out.record_types.get(kind, 0) + 1
            if kind == "history":
                row: dict[str, Any] = {}
                for item in r.history.item:
                    _set_nested(row, item)
                out.history.append(row)
            elif kind == "summary":
                for item in r.summary.update:
                    _set_nested(out.summary, item)
                for item in r.summary.remove:
                    out.summary.pop(_key(item), None)
            elif kind == "config":
                for item in r.config.update:
                    _set_nested(out.config, item)
            elif kind == "metric":
                m = r.metric
                out.metrics.append({
                    "name": m.name or m.glob_name, "step_metric": m.step_metric,
                    "hidden": m.options.hidden,
                    "summary": [s for s in ("min", "max", "mean", "last", "first", "none")
                                if getattr(m.summary, s, False)],
                })
            elif kind == "artifact":
                a = r.artifact
                out.artifacts.append({
                    "name": a.name, "type": a.type,
                    "metadata": json.loads(a.metadata) if a.metadata else {},
                    "files": [e.path for e in a.manifest.contents],
                })
            elif kind == "alert":
                out.alerts.append({"title": r.alert.title, "text": r.alert.text,
                                   "level": r.alert.level})
            elif kind == "exit":
                done = True
        if done or time.monotonic() > deadline:
            return out
        time.sleep(0.2)
