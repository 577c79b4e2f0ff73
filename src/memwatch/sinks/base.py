"""The one :class:`Sink` protocol (:mod:`memwatch.core.protocols`), the dispatcher that calls
sinks (:mod:`memwatch.runtime.dispatch`), under the names ``memwatch.sinks`` has always used, and
:class:`NullSink`, a sink that does nothing: subclass it and write only what you receive.

Example::

    >>> from memwatch.sinks import NullSink, Sink
    >>> class Checks(NullSink):
    ...     def __init__(self):
    ...         self.seen = []
    ...     def on_check(self, report):
    ...         self.seen.append(report.check)
    >>> isinstance(Checks(), Sink)
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memwatch.core.protocols import CheckReport, FindingsSink, Sink
from memwatch.runtime.dispatch import SinkSet, validate_sinks

__all__ = ["CheckReport", "FindingsSink", "NullSink", "Sink", "SinkSet", "validate_sinks"]


class NullSink:
    """A :class:`Sink` whose every method does nothing (a base for sinks that take a part)."""

    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        """The latest sample, every ``log_every_n_steps`` steps: ignored."""

    def on_check(self, report: CheckReport) -> None:
        """A check's report: ignored."""

    def on_bundle(self, path: Path, manifest: Mapping[str, Any]) -> None:
        """A committed bundle: ignored."""

    def close(self) -> None:
        """Nothing to release."""
