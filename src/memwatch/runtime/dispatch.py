"""The sink dispatcher: one fan-out, one failure rule.

Every place memwatch reports to (W&B, Prometheus, a JSONL file, a framework's own loggers) is a
:class:`memwatch.sinks.Sink`, and every call to one goes through a :class:`SinkSet`: the first
exception from a sink disables that sink with one warning, and training goes on. The integrations
share one ``SinkSet`` between their training and evaluation sessions, so a logger that failed
once stays off for both.

Every check reaches a sink through ``on_check(report)``. A sink of the older form, with
``on_findings(epoch, findings, summary)`` instead, still works: it gets the training checks.
A bundle reaches every sink with the manifest committed with it and the last sample the
recorder captured (read here once: no sink opens a bundle's files to learn what it holds).

Example::

    >>> import memwatch
    >>> from memwatch.sinks import MemorySink
    >>> sink = MemorySink()
    >>> with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp), sinks=[sink],
    ...                     log_every_n_steps=2) as mw:
    ...     for _ in range(5):
    ...         mw.step()
    >>> [step for step, _ in sink.metrics]
    [2, 4]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from memwatch.bundle.reader import open_bundle
from memwatch.core.errors import ConfigError
from memwatch.core.protocols import CheckReport

log = logging.getLogger("memwatch")

__all__ = ["SinkSet", "committed_manifest", "validate_sinks"]

_METHODS = ("on_metrics", "on_bundle", "close")
_CHECK_METHODS = ("on_check", "on_findings")  # one of them: on_findings is the older form


def validate_sinks(sinks: Iterable[Any] | None) -> list[Any]:
    """The ``sinks=`` option as a list, or :class:`ConfigError` naming what is wrong."""
    if sinks is None:
        return []
    if isinstance(sinks, SinkSet):
        return list(sinks.sinks)
    if isinstance(sinks, (str, bytes)) or not isinstance(sinks, Iterable):
        raise ConfigError(f"sinks={sinks!r} must be a list of sink objects, such as "
                          "[memwatch.sinks.JsonlSink('memwatch.jsonl')].")
    out = list(sinks)
    for s in out:
        missing = [m for m in _METHODS if not callable(getattr(s, m, None))]
        if not any(callable(getattr(s, m, None)) for m in _CHECK_METHODS):
            missing.append("on_check")
        if missing:
            raise ConfigError(
                f"sinks: {s!r} is not a sink (missing {', '.join(missing)}); a sink has "
                "on_metrics, on_check, on_bundle and close (see memwatch.sinks.Sink)."
            )
    return out


class SinkSet:
    """Calls every sink; the first exception from a sink disables it with one warning."""

    def __init__(self, sinks: Iterable[Any] | None = ()) -> None:
        self.sinks: list[Any] = validate_sinks(sinks)
        #: ``id(sink)`` -> the error that disabled it.
        self.disabled: dict[int, str] = {}
        self.closed = False

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.sinks)

    def add(self, sink: Any) -> None:
        validate_sinks([sink])
        self.sinks.append(sink)

    def remove(self, sink: Any) -> None:
        self.sinks = [s for s in self.sinks if s is not sink]

    def has(self, kind: type) -> bool:
        """Is a sink of this type in the set (enabled or not)?"""
        return any(isinstance(s, kind) for s in self.sinks)

    def _call(self, method: str, *args: Any, optional: bool = False) -> None:
        for s in self.sinks:
            if id(s) in self.disabled:
                continue
            if optional and not callable(getattr(s, method, None)):
                continue
            self._one(s, method, *args)

    def metrics(self, step: int, sample: Mapping[str, float]) -> None:
        self._call("on_metrics", step, sample)

    def check(self, report: CheckReport) -> None:
        """A check's report, to every sink's ``on_check``; a sink of the older form gets
        ``on_findings`` for training checks only (it knows nothing of evaluation loops)."""
        for s in self.sinks:
            if id(s) in self.disabled:
                continue
            if callable(getattr(s, "on_check", None)):
                self._one(s, "on_check", report)
            elif report.stage == "train":
                self._one(s, "on_findings", report.epoch, list(report.findings), report.summary)

    def _one(self, s: Any, method: str, *args: Any) -> None:
        try:
            getattr(s, method)(*args)
        except Exception as e:  # noqa: BLE001 - a sink never stops training
            self.disabled[id(s)] = f"{type(e).__name__}: {e}"
            name = getattr(s, "sink_name", None) or type(s).__name__
            log.warning("memwatch: sink %s disabled after an error in %s (%s: %s); "
                        "training continues", name, method, type(e).__name__, e)

    def bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        """A committed bundle, with the manifest on disk (its ``files`` list what the bundle
        holds, as the recorder committed it) over what the recorder passed."""
        self._call("on_bundle", path, committed_manifest(path, manifest))

    def log(self, metrics: Mapping[str, float], step: int | None) -> None:
        """Logger-ready keys reported outside checks, to the sinks that take them (``on_log``)."""
        if metrics:
            self.notify("on_log", dict(metrics), step)

    def notify(self, method: str, *args: Any) -> None:
        """Call an optional sink method on the sinks that have it (same failure rule)."""
        self._call(method, *args, optional=True)

    def wants_final_bundle(self) -> bool:
        return any(bool(getattr(s, "wants_final_bundle", False)) for s in self.sinks
                   if id(s) not in self.disabled)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._call("close")


def committed_manifest(path: Path, given: Mapping[str, Any]) -> dict[str, Any]:
    """The bundle's manifest as committed (validated: every file it lists is there, at its
    size), over ``given``, plus ``latest``: the last sample the recorder captured (metric ->
    bytes or count, at the failure for an OOM), which no sink was handed through
    ``on_metrics``. ``given`` alone when the bundle cannot be read."""
    try:
        bundle = open_bundle(path)
        out = {**given, **bundle.manifest}
        memory = bundle.read_json("memory.json") if "memory.json" in bundle.manifest["files"] \
            else None
        latest = memory.get("latest") if isinstance(memory, dict) else None
        if isinstance(latest, dict):
            out["latest"] = {str(k): float(v) for k, v in latest.items()
                             if isinstance(v, (int, float)) and math.isfinite(v)}
        return out
    except Exception as e:  # noqa: BLE001 - the sinks still hear of the bundle
        log.debug("memwatch: bundle %s read back without its manifest (%s)", path, e)
        return dict(given)
