"""Layer 3, the verdicts: pure functions of epoch summaries plus a :class:`CheckContext`.

:class:`Analyzer` orchestrates (:mod:`.analyzer`); the rules it runs live one per module in
:mod:`.rules` (their registry: :data:`memwatch.analysis.rules.RULES`), the statistics they share
in :mod:`.stats`, and everything that reads the live process to name a culprit in
:mod:`.culprits`, behind the one :class:`Evidence` port.
"""

from memwatch.analysis.analyzer import LEAK_METRICS, Analyzer
from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.culprits.census.census import tensor_census
from memwatch.analysis.evidence import Evidence

__all__ = ["LEAK_METRICS", "Analyzer", "AnalyzerConfig", "CheckContext", "Evidence",
           "tensor_census"]
