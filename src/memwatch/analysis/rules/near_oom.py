"""Near-OOM: an epoch whose peak came within a margin of the known limit."""

from __future__ import annotations

import math

from memwatch.analysis.rules.base import Rule, RuleInput
from memwatch.analysis.rules.words import limit_words, where
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes

__all__ = ["METRICS", "NAME", "RULE", "advice", "judge"]

NAME = "near_oom"

METRICS = ("device.peak", "device.reserved", "host.rss", "cgroup.working_set")


def judge(inp: RuleInput) -> list[Finding]:
    """A unit whose peak came within ``near_oom_margin`` of its limit."""
    summary, ctx, cfg = inp.summary, inp.ctx, inp.cfg
    out = []
    margin = cfg.near_oom_margin
    for metric in METRICS:
        if metric not in summary.keys:
            continue
        limit = ctx.limit(metric)
        peak = float(summary.peak[summary.keys.index(metric)])
        if limit is None or math.isnan(peak) or peak < (1 - margin) * limit:
            continue
        out.append(near_oom(ctx.origin, metric, peak, limit, margin, ctx.limit_name(metric)))
        if metric.startswith("device."):
            break  # one device finding is enough
    return out


def near_oom(origin: Origin, metric: str, peak: float, limit: float, margin: float,
             limit_name: str | None = None) -> Finding:
    share = peak / limit if limit else 0.0
    severity: Severity = "critical" if share >= 0.98 else "warning"
    msg = (
        f"{where(metric)} peaked at {fmt_bytes(peak)}, {share:.0%} of "
        f"{limit_words(limit, limit_name)} (within the {margin:.0%} margin): the next larger "
        "batch, longer sequence or evaluation pass may not fit."
    )
    return origin.finding(rule=NAME, kind="near_oom", metric=metric, severity=severity,
                          message=msg, suggestions=advice(metric),
                          evidence={"peak": peak, "limit": limit, "share": share,
                                    "limit_name": limit_name})


def advice(metric: str) -> list[str]:
    """What to do, in the failure's own domain: a device's memory is freed by a smaller batch
    or activation checkpointing; host memory by what holds it (a batch size does not shrink a
    dataset loaded in RAM or a list that grows)."""
    if metric.startswith("device."):
        return ["Lower the batch size or enable activation checkpointing; check the per-step "
                "peak (device.peak) rather than the average."]
    return ["Host memory is what runs out, not a device's: see what holds it (a leak's holder "
            "among the findings; `memwatch inspect` on a bundle lists the largest live objects "
            "and their holders), then keep less of it in this process: a dataset read lazily "
            "or memory-mapped instead of loaded whole, fewer or lighter DataLoader workers "
            "(each is a process of its own), caches bounded.",
            "Or give the job more host memory: a larger memory cgroup, a higher `ulimit -v`, "
            "a machine with more RAM."]


RULE: Rule[RuleInput] = Rule(name=NAME, kinds=frozenset({"near_oom"}), once=frozenset(),
                             judge=judge, reads=METRICS)
