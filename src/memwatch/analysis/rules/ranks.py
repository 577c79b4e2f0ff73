"""Cross-rank verdicts (rank 0 of a distributed run): who leaks, who is closest to OOM, whose
peaks are out of line, who did not answer the epoch-end exchange.

A rule of its own input (:class:`RankInput`): the per-rank summaries that
:mod:`memwatch.runtime.exchange` gathers at a check, judged by rank 0 after the exchange rather
than on one process's summaries. Pure: recorded summaries in, findings out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from memwatch.analysis.rules.base import Rule
from memwatch.core.findings import Finding, Origin, Severity
from memwatch.core.units import fmt_bytes

__all__ = ["NAME", "RULE", "RankInput", "cross_rank_findings", "judge"]

NAME = "ranks"
_GRAVITY = {"info": 0, "warning": 1, "critical": 2}


@dataclasses.dataclass(frozen=True)
class RankInput:
    """What rank 0 judges after a check's exchange.

    Attributes:
        summaries: one summary per rank (``None`` for a rank that did not answer).
        missing: the ranks the exchange gave up on.
        timeout_s: how long it waited for them.
        origin: where this check's findings are born.
    """

    summaries: Sequence[dict[str, Any] | None]
    missing: Sequence[int]
    timeout_s: float
    origin: Origin = Origin()


def judge(inp: RankInput) -> list[Finding]:
    """Rank 0's verdicts across the ranks of one check."""
    return cross_rank_findings(inp.summaries, inp.missing, inp.timeout_s, inp.origin)


def cross_rank_findings(summaries: Sequence[dict[str, Any] | None], missing: Sequence[int],
                        timeout_s: float, origin: Origin | None = None) -> list[Finding]:
    """Rank 0's verdicts across ranks: who leaks, who is closest to OOM, who is imbalanced, who
    did not answer."""
    origin = origin or Origin()
    out: list[Finding] = []
    world = len(summaries)
    alive = [s for s in summaries if s is not None]
    absent = sorted(set(missing) | {i for i, s in enumerate(summaries) if s is None})
    if absent:
        out.append(origin.finding(
            rule=NAME, kind="rank_unresponsive", metric="ranks", severity="warning",
            message=(f"Rank(s) {', '.join(map(str, absent))} of {world} did not reach the "
                     f"epoch-end exchange within {timeout_s:.0f} s: dead (an OOM leaves a bundle "
                     "named ...-rank<r>-pid<p> under each rank's out_dir/oom/) or stuck; the "
                     "other ranks will hang in their next collective."),
            suggestions=["Look for that rank's bundle: `memwatch ls <out_dir>` groups them by "
                         "job and rank."],
            evidence={"ranks": absent, "timeout_s": timeout_s}))
    # Where each rank runs: named when the job spans several nodes (hosts).
    where = {int(s["rank"]): _node_name(s) for s in alive}
    several = len(set(where.values())) > 1

    def on(r: int) -> str:
        return f" on {where[r]}" if several and r in where else ""

    # Leaks on some ranks only.
    leak_by_metric: dict[str, dict[int, dict[str, Any]]] = {}
    for s in alive:
        for f in s["findings"]:
            if f["kind"] == "leak":
                leak_by_metric.setdefault(f["metric"], {})[int(s["rank"])] = f
    for metric, by_rank in leak_by_metric.items():
        ranks = sorted(by_rank)
        only_some = len(ranks) < len(alive)
        worst = min(by_rank.items(), key=lambda kv: kv[1]["steps_to_oom"] or math.inf)
        rates = {r: by_rank[r]["bytes_per_step"] for r in ranks}
        scope = (f"only on rank(s) {', '.join(map(str, ranks))} of {world}" if only_some
                 else f"on every rank ({world})")
        if only_some and on(ranks[0]):
            scope += " (" + ", ".join(f"rank {r}{on(r)}" for r in ranks) + ")"
        msg = (f"{metric} leaks {scope}: "
               + ", ".join(f"rank {r} {fmt_bytes(v or 0)}/step" for r, v in rates.items()) + ".")
        if only_some:
            msg += (" A leak on some ranks only points at rank-dependent code: logging or "
                    "evaluation on rank 0, uneven shards, a cache keyed by rank.")
        if worst[1]["steps_to_oom"] is not None:
            msg += (f" Rank {worst[0]}{on(worst[0])} runs out first, in about "
                    f"{worst[1]['steps_to_oom']:,.0f} steps.")
        # As grave as the gravest rank's own verdict: growth that cannot kill this run on any
        # rank is information here too.
        sev: Severity = max((f["severity"] for f in by_rank.values()),
                            key=lambda v: _GRAVITY.get(v, 1))
        out.append(origin.finding(
            rule=NAME, kind="rank_leak", metric=metric, severity=sev, message=msg,
            bytes_per_step=max((v or 0.0) for v in rates.values()),
            steps_to_oom=worst[1]["steps_to_oom"], culprit=f"rank {worst[0]}{on(worst[0])}: "
            + (worst[1]["culprit"] or "see that rank's findings"),
            evidence={"ranks": ranks, "only_some_ranks": only_some, "bytes_per_step": rates,
                      "world_size": world, "nodes": {r: where[r] for r in ranks}},
            rank=worst[0]))
    # Ranks close to their limit: the job's first OOM will be on one of them.
    near_by_metric: dict[str, dict[int, str]] = {}
    for s in alive:
        for f in s["findings"]:
            if f["kind"] == "near_oom":
                near_by_metric.setdefault(f["metric"], {})[int(s["rank"])] = f["severity"]
    for metric, sev_by_rank in near_by_metric.items():
        shares = {int(s["rank"]): s["peak"][metric] / s["limits"][metric] for s in alive
                  if s["peak"].get(metric) and s["limits"].get(metric)}
        ranks = sorted(sev_by_rank, key=lambda r: -shares.get(r, 0.0))
        closest = ranks[0]
        limit = next((s["limits"][metric] for s in alive if int(s["rank"]) == closest), None)
        others = [v for r, v in shares.items() if r not in sev_by_rank]
        msg = (f"{metric} is near its limit on rank(s) {', '.join(map(str, ranks))} of {world}: "
               + ", ".join(f"rank {r} at {shares[r]:.0%}" for r in ranks if r in shares)
               + (f" of {fmt_bytes(limit)}" if limit else "")
               + f". The job's first OOM will most likely be on rank {closest}{on(closest)}"
               + (f"; the other ranks peak at {max(others):.0%} at most." if others else "."))
        sev_near: Severity = "critical" if "critical" in sev_by_rank.values() else "warning"
        out.append(origin.finding(
            rule=NAME, kind="rank_near_oom", metric=metric, severity=sev_near, message=msg,
            suggestions=["Look at what that rank does differently (a larger shard, the logging or "
                         "evaluation done on rank 0 only, uneven sequence lengths); balance it "
                         "or lower the batch size for every rank."],
            evidence={"ranks": ranks, "share": shares,
                      "others_max_share": max(others) if others else None},
            rank=closest))
    # Peak imbalance.
    peak_metric = next((m for m in ("device.peak", "device.allocated", "host.rss")
                        if all(m in s["peak"] for s in alive)), None)
    if peak_metric is not None and len(alive) > 1:
        metric = peak_metric
        peaks = {int(s["rank"]): float(s["peak"][metric]) for s in alive}
        hi_r, hi = max(peaks.items(), key=lambda kv: kv[1])
        lo_r, lo = min(peaks.items(), key=lambda kv: kv[1])
        ratio = hi / lo if lo > 0 else math.inf
        limit = next((s["limits"].get(metric) for s in alive if s["limits"].get(metric)), None)
        if ratio > 1.2:
            out.append(origin.finding(
                rule=NAME, kind="rank_imbalance", metric=metric, severity="info",
                message=(f"{metric} peaks differ across ranks: rank {hi_r}{on(hi_r)} at "
                         f"{fmt_bytes(hi)}, rank {lo_r}{on(lo_r)} at {fmt_bytes(lo)} "
                         f"({ratio:.2f}x). The highest rank decides when the job runs out of "
                         "memory."
                         + (f" It is at {hi / limit:.0%} of its limit." if limit else "")),
                evidence={"peaks": peaks, "imbalance": ratio}, rank=hi_r))
    return out


def _node_name(summary: dict[str, Any]) -> str:
    """The node a rank's summary says it runs on (its launcher's name for it, else its host)."""
    node = summary.get("node")
    name = node.get("name") if isinstance(node, dict) else None
    return str(name or summary.get("host") or "?")


RULE: Rule[RankInput] = Rule(
    name=NAME,
    kinds=frozenset({"rank_leak", "rank_near_oom", "rank_imbalance", "rank_unresponsive"}),
    once=frozenset(), judge=judge, reads=("ranks",))
