"""The analyzer: verdicts at epoch ends (trend, leaks, fragmentation, forecasts, attribution)."""

from memwatch.analysis.census import tensor_census

__all__ = ["tensor_census"]
