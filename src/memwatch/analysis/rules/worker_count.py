"""Workers that multiply: DataLoader worker processes whose number keeps rising across checks.

A persistent-worker DataLoader built again and again (an eval loader rebuilt at every
``evaluate()`` and kept by whatever prepared it: transformers#28469) leaves its workers alive:
the count of live workers rises at every evaluation while each worker stays the same size. That
is not per-worker growth (a cache in the Dataset) and the fix is not in the Dataset: it is
whatever keeps the old DataLoaders. The verdict needs the **floor** of the count (its minimum
over a unit) to rise at two checks in a row: workers of a non-persistent loader come and go
every epoch, and an eval loader's exist only while it runs, so neither moves the floor, whatever
the sampling caught. The holder is named from the live DataLoaders whose worker processes are
still running, asked of the evidence port at the check (one pass over the collector's objects,
only then). While the count rises, the workers' memory is this rule's to judge: the per-worker
rules (:mod:`.workers`, :mod:`.copy_on_write`) say nothing.
"""

from __future__ import annotations

from memwatch.analysis.rules.base import Rule, RuleInput
from memwatch.analysis.stats.forecast import steps_to_limit
from memwatch.analysis.stats.settle import COUNT, count_rising
from memwatch.analysis.stats.shapes import last_value
from memwatch.core.findings import Finding
from memwatch.core.units import fmt_bytes

__all__ = ["NAME", "RULE", "judge"]

NAME = "worker_count"


def judge(inp: RuleInput) -> list[Finding]:
    """A ``worker_count`` leak when the count's floor rose at each of the last two checks; the
    evidence port names who keeps the DataLoaders (asked only then)."""
    history, ctx = inp.history, inp.ctx
    if ctx.defer_leaks or "workers.uss" not in inp.stats or COUNT not in inp.summary.keys \
            or not last_value(inp.summary, COUNT):
        return []
    count = history.get(COUNT, [])
    uss = history.get("workers.uss", [])
    if not count_rising(count) or not uss:
        return []
    first, cur = count[-3], count[-1]
    steps = sum(h.n_steps for h in count[-3:-1]) or cur.n_steps
    new_workers = cur.floor - first.floor
    # What each live worker holds, from the latest unit: the USS of the first units can be
    # missing (a unit whose workers started near its end has no settled window), and the verdict
    # is the count's. Memory grows by that much for every new worker.
    per_worker = uss[-1].floor / cur.floor if cur.floor > 0 else 0.0
    slope = max(per_worker * new_workers, 0.0) / max(steps, 1)
    limit = ctx.limit("host.rss")
    peak = uss[-1].peak
    steps_to_oom = steps_to_limit(limit, peak, slope)
    severity = inp.severity(steps_to_oom, uss[-1])
    seconds = None if steps_to_oom is None else steps_to_oom * uss[-1].seconds_per_step
    loaders, holder = inp.evidence.loaders_with_workers()
    where = holder.describe() if holder is not None else None
    culprit = (f"{where} — {loaders} DataLoaders with live workers" if where else
               f"{loaders} DataLoaders with live workers" if loaders else
               "DataLoader worker processes left running")
    msg = (
        f"The number of live DataLoader worker processes keeps rising: {int(first.floor)} → "
        f"{int(cur.floor)} over the last checks, while each worker holds about "
        f"{fmt_bytes(per_worker)} of private memory (workers.uss {fmt_bytes(uss[-1].floor)} in "
        f"all). New workers are started and the old ones never stop: "
        "DataLoaders with persistent workers are being built again (often one per evaluation) "
        "and something keeps the old ones alive."
    )
    if where:
        msg += f" {loaders} of them are alive, held by {where}."
    if steps_to_oom is not None:
        msg += f" At this rate the {fmt_bytes(limit)} limit is reached in about " \
               f"{steps_to_oom:,.0f} steps."
    return [ctx.origin.finding(
        rule=NAME, kind="leak", metric=COUNT, severity=severity, message=msg,
        bytes_per_step=slope,
        steps_to_oom=steps_to_oom, seconds_to_oom=seconds, culprit=culprit,
        suggestions=[
            "Build the DataLoader once and reuse it (cache the eval loader: the fix of "
            "transformers#28469), or do not keep references to old ones.",
            "For a loader used now and then (evaluation), `persistent_workers=False` stops its "
            "workers when each pass ends.",
            "If something must keep the loaders (a framework's prepare()), shut their workers "
            "down when done: `del loader` after the last reference, or the framework's "
            "free_memory().",
        ],
        evidence={"pattern": "worker_count", "count_floors": [h.floor for h in count[-6:]],
                  "uss_floors": [h.floor for h in uss[-6:]], "per_worker_bytes": per_worker,
                  "loaders_with_workers": loaders, "holder": where,
                  "remaining_steps": ctx.remaining(uss[-1])},
    )]


RULE: Rule[RuleInput] = Rule(name=NAME, kinds=frozenset({"leak"}), once=frozenset(),
                             judge=judge, reads=(COUNT, "workers.uss"))
