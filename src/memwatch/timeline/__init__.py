"""Layer 2, where samples are kept: the fixed-memory :class:`Timeline` with its per-epoch
:class:`EpochSummary` buckets, and the background sampler of the slow probes."""

from memwatch.timeline.store import Timeline
from memwatch.timeline.summary import EpochSummary

__all__ = ["EpochSummary", "Timeline"]
