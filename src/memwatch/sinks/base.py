"""The one :class:`Sink` protocol, and the dispatcher the session drives.

A sink receives what a :class:`memwatch.MemWatch` learns, at a pace it can afford:

* ``on_metrics(step, sample)`` every ``log_every_n_steps`` optimizer steps (``sample`` is the
  latest sample: metric -> bytes or count, NaN where a probe has no reading);
* ``on_findings(epoch, findings, summary)`` at every epoch end (the new findings, possibly none,
  and that epoch's :class:`memwatch.timeline.EpochSummary`);
* ``on_bundle(path, manifest)`` when the flight recorder has written a bundle (already redacted);
* ``close()`` once, when the session closes.

Sinks run on the training thread (the recorder's hook may also run from an exception hook or a
signal handler). A sink that raises is disabled after one warning: it never stops training.

A sink may also set ``wants_final_bundle = True``: when the session closes, it then writes one
end-of-run bundle first (report + snapshot), which every sink receives through ``on_bundle``.

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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from memwatch.core.errors import ConfigError
from memwatch.core.findings import Finding

log = logging.getLogger("memwatch")

__all__ = ["Sink", "SinkSet", "validate_sinks"]


@runtime_checkable
class Sink(Protocol):
    """Where memwatch's samples, findings and bundles go (W&B, Prometheus, a JSONL file...)."""

    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        """The latest sample, every ``log_every_n_steps`` steps."""

    def on_findings(self, epoch: int, findings: Sequence[Finding], summary: Any) -> None:
        """An epoch ended: its new findings (maybe none) and its ``EpochSummary``."""

    def on_bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        """The flight recorder wrote a (redacted) bundle at ``path``."""

    def close(self) -> None:
        """The session closes; flush and release. Called once."""


_METHODS = ("on_metrics", "on_findings", "on_bundle", "close")


def validate_sinks(sinks: Iterable[Any] | None) -> list[Any]:
    """The ``sinks=`` option as a list, or :class:`ConfigError` naming what is wrong."""
    if sinks is None:
        return []
    if isinstance(sinks, (str, bytes)) or not isinstance(sinks, Iterable):
        raise ConfigError(f"sinks={sinks!r} must be a list of sink objects, such as "
                          "[memwatch.sinks.JsonlSink('memwatch.jsonl')].")
    out = list(sinks)
    for s in out:
        missing = [m for m in _METHODS if not callable(getattr(s, m, None))]
        if missing:
            raise ConfigError(
                f"sinks: {s!r} is not a sink (missing {', '.join(missing)}); a sink has "
                "on_metrics, on_findings, on_bundle and close (see memwatch.sinks.Sink)."
            )
    return out


class SinkSet:
    """Calls every sink; the first exception from a sink disables it with one warning."""

    def __init__(self, sinks: Iterable[Any] = ()) -> None:
        self.sinks: list[Any] = list(sinks)
        self.disabled: dict[int, str] = {}
        self.closed = False

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def add(self, sink: Any) -> None:
        validate_sinks([sink])
        self.sinks.append(sink)

    def _call(self, method: str, *args: Any) -> None:
        for s in self.sinks:
            if id(s) in self.disabled:
                continue
            try:
                getattr(s, method)(*args)
            except Exception as e:  # noqa: BLE001 - a sink never stops training
                self.disabled[id(s)] = f"{type(e).__name__}: {e}"
                log.warning("memwatch: sink %s disabled after an error in %s (%s: %s); "
                            "training continues", type(s).__name__, method, type(e).__name__, e)

    def metrics(self, step: int, sample: Mapping[str, float]) -> None:
        self._call("on_metrics", step, sample)

    def findings(self, epoch: int, findings: Sequence[Finding], summary: Any) -> None:
        self._call("on_findings", epoch, findings, summary)

    def bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        self._call("on_bundle", path, manifest)

    def wants_final_bundle(self) -> bool:
        return any(bool(getattr(s, "wants_final_bundle", False)) for s in self.sinks
                   if id(s) not in self.disabled)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._call("close")
