"""Near-OOM: an epoch whose peak came within a margin of the known limit."""

from __future__ import annotations

import math

from memwatch.analysis.rules.base import Rule, RuleInput
from memwatch.analysis.rules.words import where
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes

__all__ = ["METRICS", "NAME", "RULE", "judge"]

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
        out.append(near_oom(ctx.origin, metric, peak, limit, margin))
        if metric.startswith("device."):
            break  # one device finding is enough
    return out


def near_oom(origin: Origin, metric: str, peak: float, limit: float, margin: float) -> Finding:
    share = peak / limit if limit else 0.0
    severity: Severity = "critical" if share >= 0.98 else "warning"
    msg = (
        f"{where(metric)} peaked at {fmt_bytes(peak)}, {share:.0%} of the {fmt_bytes(limit)} "
        f"limit (within the {margin:.0%} margin): the next larger batch, longer sequence or "
        "evaluation pass may not fit."
    )
    return origin.finding(rule=NAME, kind="near_oom", metric=metric, severity=severity,
                          message=msg,
                          suggestions=["Lower the batch size or enable activation "
                                       "checkpointing; check the per-step peak (device.peak) "
                                       "rather than the average."],
                          evidence={"peak": peak, "limit": limit, "share": share})


RULE: Rule[RuleInput] = Rule(name=NAME, kinds=frozenset({"near_oom"}), once=frozenset(),
                             judge=judge, reads=METRICS)
