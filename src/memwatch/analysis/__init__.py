"""Layer 3, the verdicts: pure functions of epoch summaries plus a :class:`CheckContext`.

:class:`Analyzer` orchestrates; each rule lives in its own module (leak, workers,
fragmentation, near_oom, forecast, attribution, ranks), the messages in ``explain``.
"""

from memwatch.analysis.analyzer import LEAK_METRICS, Analyzer
from memwatch.analysis.census import tensor_census
from memwatch.analysis.context import AnalyzerConfig, CheckContext

__all__ = ["LEAK_METRICS", "Analyzer", "AnalyzerConfig", "CheckContext", "tensor_census"]
