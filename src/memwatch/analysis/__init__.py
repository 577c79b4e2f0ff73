"""The analyzer: verdicts at epoch ends (trend, leaks, fragmentation, forecasts, attribution)."""

from memwatch.analysis.analyzer import LEAK_METRICS, Analyzer, AnalyzerConfig
from memwatch.analysis.census import tensor_census

__all__ = ["LEAK_METRICS", "Analyzer", "AnalyzerConfig", "tensor_census"]
