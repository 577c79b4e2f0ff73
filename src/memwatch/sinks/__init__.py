"""Sinks: where memwatch's samples, findings and bundles go, through one :class:`Sink` protocol.

======================================  ========================================================
sink                                    what it writes
======================================  ========================================================
:class:`NullSink`                       nothing: a base to subclass, overriding what you need
:class:`MemorySink`                     Python lists (tests, notebooks)
:class:`JsonlSink`                      an append-only, rotated JSON-lines event log
:class:`memwatch.sinks.wandb.WandbSink`          the user's W&B run: charts, findings table, leak
                                        charts, summary, alerts, bundle artifacts
:class:`memwatch.sinks.prometheus.PrometheusSink`  gauges and counters on an HTTP exporter
======================================  ========================================================

:mod:`memwatch.bundle.export` writes a timeline to CSV or JSON. Importing this package imports
neither wandb nor prometheus_client: those sinks live in their own modules (also reachable here
by attribute, imported on first use).

Example::

    >>> from memwatch.sinks import Sink, MemorySink, JsonlSink
    >>> isinstance(MemorySink(), Sink)
    True
"""

from __future__ import annotations

from typing import Any

from memwatch.sinks.base import CheckReport, FindingsSink, NullSink, Sink, SinkSet, validate_sinks
from memwatch.sinks.jsonl import JsonlSink
from memwatch.sinks.memory import MemorySink

__all__ = ["CheckReport", "FindingsSink", "JsonlSink", "MemorySink", "NullSink", "PrometheusSink",
           "Sink", "SinkSet", "WandbSink", "validate_sinks"]


def __getattr__(name: str) -> Any:
    # Lazy: `import memwatch.sinks` must not pull in the optional sinks' modules.
    if name == "WandbSink":
        from memwatch.sinks.wandb import WandbSink

        return WandbSink
    if name == "PrometheusSink":
        from memwatch.sinks.prometheus import PrometheusSink

        return PrometheusSink
    raise AttributeError(f"module 'memwatch.sinks' has no attribute {name!r}")
