"""Wording every rule shares: how a message names a metric, a rate's interval, the units judged,
a forecast in words, and the benign shapes more than one rule says (accumulation, a plateau).
Each rule's own messages live beside the rule (its module); how a culprit reads lives in
:mod:`memwatch.analysis.culprits.wording`.
"""

from __future__ import annotations

from typing import Any

from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes, fmt_duration

__all__ = ["accumulation", "benign", "ci", "forecast_words", "limit_words", "plateau", "span",
           "where"]


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


def limit_words(limit: float, limit_name: str | None) -> str:
    """How a message names the limit a metric runs into: its size and what it is, or, for a
    process limit (``ulimit -v``/``-d``), the limit as it was set and where this metric meets
    it (the process maps more than its resident memory: its RSS reaches the address-space limit
    well below the value set).

    Example::

        >>> limit_words(2**31, "physical memory")
        'the 2.0 GiB limit of physical memory'
        >>> limit_words(2**31, "the address-space limit (RLIMIT_AS 2.86 GiB)")
        'the address-space limit (RLIMIT_AS 2.86 GiB: this memory meets it at about 2.0 GiB)'
    """
    if limit_name and "RLIMIT_" in limit_name and limit_name.endswith(")"):
        return f"{limit_name[:-1]}: this memory meets it at about {fmt_bytes(limit)})"
    return f"the {fmt_bytes(limit)} limit" + (f" of {limit_name}" if limit_name else "")


def forecast_words(limit: float | None, steps_to_oom: float | None,
                   seconds_to_oom: float | None, severity: Severity, remaining: float,
                   run_known: bool, limit_name: str | None = None) -> str:
    """The forecast in words, for a threat ("reached in about 1,200 steps (40 min)") or not
    ("9 years away ...: not a threat to this run"), naming the limit that binds."""
    if limit is None:
        return " No memory limit is known to forecast against."
    if steps_to_oom is None:
        return ""
    what = limit_words(limit, limit_name)
    if severity != "info":
        return (f" At this rate {what} is reached in about "
                f"{steps_to_oom:,.0f} steps ({fmt_duration(seconds_to_oom)}).")
    after = (f", after this run ends ({remaining:,.0f} steps left)" if run_known else
             f", beyond the {fmt_duration(remaining * (seconds_to_oom or 0) / steps_to_oom)} "
             "horizon" if steps_to_oom else "")
    return (f" At this rate {what} is {fmt_duration(seconds_to_oom)} away "
            f"({steps_to_oom:,.0f} steps){after}: not a threat to this run.")


# --------------------------------------------------------------------------- benign shapes

def benign(origin: Origin, rule: str, kind: str, metric: str, message: str,
           **evidence: Any) -> Finding:
    """A shape that is not a leak: informational, with the figures it was judged on."""
    return origin.finding(rule=rule, kind=kind, metric=metric, severity="info", message=message,
                          evidence=evidence)


def accumulation(origin: Origin, rule: str, metric: str, cur: EpochStats,
                 prev: EpochStats | None) -> Finding:
    """Growth within each epoch, released at its end."""
    base = prev.floor if prev is not None else cur.lo_start
    msg = (
        f"{where(metric)} grows within each epoch (by about {fmt_bytes(cur.growth)}, "
        f"{fmt_bytes(cur.slope)} per step) and is released at the epoch end: the floor returned "
        f"to {fmt_bytes(base)}. This is epoch-scoped accumulation (outputs or metrics gathered "
        "for the epoch), not a leak — but the peak grows with the epoch length."
    )
    return origin.finding(rule=rule, kind="accumulation", metric=metric, severity="info",
                          message=msg, bytes_per_step=cur.slope,
                          suggestions=["If epochs get longer, reduce what is gathered per step "
                                       "(`.item()`, `.cpu()`, running sums instead of lists)."],
                          evidence={"epoch_rise": cur.rise, "floor": cur.floor,
                                    "peak": cur.peak})


def plateau(origin: Origin, rule: str, metric: str, cur: EpochStats) -> Finding:
    """Growth that levelled off."""
    late_rate = f"{cur.saturation:.0%} of the early rate"
    return benign(origin, rule, "plateau", metric, (
        f"{where(metric)} grew by {fmt_bytes(max(cur.rise, 0))} and levelled off (the late "
        f"half rises at {late_rate}): a warm-up, a bounded cache filling or allocator pools "
        "settling. Not a leak."), saturation_ratio=cur.saturation, rise=cur.rise, floor=cur.floor)
