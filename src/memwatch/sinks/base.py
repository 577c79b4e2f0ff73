"""The one :class:`Sink` protocol (:mod:`memwatch.core.protocols`) and the dispatcher that calls
sinks (:mod:`memwatch.runtime.dispatch`), under the names ``memwatch.sinks`` has always used."""

from memwatch.core.protocols import CheckReport, FindingsSink, Sink
from memwatch.runtime.dispatch import SinkSet, validate_sinks

__all__ = ["CheckReport", "FindingsSink", "Sink", "SinkSet", "validate_sinks"]
