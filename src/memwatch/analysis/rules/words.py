"""Wording every rule shares: how a message names a metric, a rate's interval, the units judged,
and a forecast in words. Each rule's own messages live beside the rule (its module); how a
culprit reads lives in :mod:`memwatch.analysis.culprits.wording`.
"""

from __future__ import annotations

from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Severity
from memwatch.core.units import fmt_bytes, fmt_duration

__all__ = ["ci", "forecast_words", "span", "where"]


def where(metric: str) -> str:
    """How a message names a metric (its first words)."""
    return {
        "device.allocated": "Memory allocated by tensors on the accelerator",
        "device.reserved": "Memory reserved by the accelerator's caching allocator",
        "host.rss": "This process's resident host memory (RSS)",
        "host.uss": "This process's private host memory (USS)",
        "host.rss_anon": "This process's anonymous resident memory (the heap, anonymous maps)",
        "host.rss_shmem": "This process's resident shared memory (/dev/shm, memfd)",
        "workers.uss": "Private memory (USS) of the DataLoader worker processes",
        "workers.rss": "Resident memory of the DataLoader worker processes",
        "cgroup.working_set": ("The job's memory cgroup (this process, its workers and the rest "
                               "of the job, page cache it can reclaim excluded)"),
    }.get(metric, metric)


def ci(slope_ci: tuple[float, float]) -> str:
    lo, hi = slope_ci
    return f"95% CI {fmt_bytes(lo)}–{fmt_bytes(hi)} per step"


def span(stats: list[EpochStats]) -> str:
    """"over 3 epochs" / "across 4 checks": what the units judged were."""
    if stats and stats[-1].unit.startswith("s"):
        return f"across {len(stats)} checks"
    return f"over {len(stats)} epochs"


def forecast_words(limit: float | None, steps_to_oom: float | None,
                   seconds_to_oom: float | None, severity: Severity, remaining: float,
                   run_known: bool, limit_name: str | None = None) -> str:
    """The forecast in words, for a threat ("reached in about 1,200 steps (40 min)") or not
    ("9 years away ...: not a threat to this run"), naming the limit that binds."""
    if limit is None:
        return " No memory limit is known to forecast against."
    if steps_to_oom is None:
        return ""
    what = f"the {fmt_bytes(limit)} limit" + (f" of {limit_name}" if limit_name else "")
    if severity != "info":
        return (f" At this rate {what} is reached in about "
                f"{steps_to_oom:,.0f} steps ({fmt_duration(seconds_to_oom)}).")
    after = (f", after this run ends ({remaining:,.0f} steps left)" if run_known else
             f", beyond the {fmt_duration(remaining * (seconds_to_oom or 0) / steps_to_oom)} "
             "horizon" if steps_to_oom else "")
    return (f" At this rate {what} is {fmt_duration(seconds_to_oom)} away "
            f"({steps_to_oom:,.0f} steps){after}: not a threat to this run.")
