"""Copy-on-write in DataLoader workers: not a leak, and bounded by what the Dataset holds.

Forked workers share the parent's pages until they write to them, and CPython writes to every
object it reads (its reference count): reading a Dataset of Python objects (a list of dicts, of
strings, of tuples) turns the shared pages that hold them private one by one (pytorch#13246).
The workers' private memory (USS) rises while their resident memory (RSS) does not — the pages
were resident already, now they are the worker's own — and it stops once every page a worker
reads has been copied.

The verdict, at a check where the workers' copying exceeds the USS noise. The copying is the
larger of two measures (:mod:`memwatch.analysis.stats.settle`): the USS rise from where every
worker was up and settled, when their RSS rose by less than half as much; and the USS rise less
the RSS rise since every worker was up (new private memory — a cache in the Dataset — raises
both alike; copying shared pages raises USS alone, so the difference is the copying whenever
the settled window began, which on a loaded machine is after most of it). Then:

* per worker, the rise is at most what the Dataset's Python objects occupy (the evidence port's
  :meth:`~memwatch.analysis.evidence.Evidence.dataset_bytes`: the pages reading them can write,
  array buffers and tensor storages left out since reading never writes them): a worker can
  copy no more than it reads, and a rise beyond that is something else. Without that figure
  (the loaders could not be found), ``AnalyzerConfig.cow_min_per_worker`` stands in for the
  start-up copy every worker makes whatever its Dataset;
* and per worker above that start-up copy in any case (a numpy Dataset: its objects account
  for almost nothing, and its workers' few MiB of start-up copying is no finding; nor is a
  small Dataset of Python objects copied whole). Below it, the Dataset is not weighed.

It is said once, as ``plateau`` with ``evidence["pattern"] == "copy_on_write"``.
"""

from __future__ import annotations

from memwatch.analysis.rules.base import Rule, RuleInput
from memwatch.analysis.rules.words import where
from memwatch.analysis.stats.settle import COUNT, copied_since_all_up, count_rising
from memwatch.analysis.stats.shapes import EpochStats, last_value
from memwatch.core.findings import Finding, Origin
from memwatch.core.units import fmt_bytes

__all__ = ["NAME", "RULE", "judge"]

NAME = "copy_on_write"
METRIC = "workers.uss"
#: A worker copies at most what it reads; the measure of what the Dataset holds is an estimate
#: from a sample of its objects: allow this much above it.
SLACK = 1.25


def judge(inp: RuleInput) -> list[Finding]:
    """Copy-on-write in the DataLoader workers at this check, said once."""
    history, ctx, cfg = inp.history, inp.ctx, inp.cfg
    hist = history.get(METRIC, [])
    count = last_value(inp.summary, COUNT)
    if not hist or not count or METRIC not in inp.stats or \
            count_rising(history.get(COUNT, [])):
        return []
    cur = hist[-1]
    rss_hist = history.get("workers.rss", [])
    rss = rss_hist[-1] if rss_hist and rss_hist[-1].unit == cur.unit else None
    uss_gain = max(cur.rise, cur.growth)
    rss_gain = max(rss.rise, rss.growth) if rss is not None else 0.0
    # Two measures of the copying: the settled window's USS rise when RSS rose by less than half
    # as much, and the USS rise less the RSS rise since every worker was up (start-up
    # included; the settled window may have missed most of it on a loaded machine).
    settled = uss_gain if rss_gain < 0.5 * uss_gain else 0.0
    copied = max(settled, copied_since_all_up(inp.summary) or 0.0)
    if cur.shape not in ("growing", "plateau", "step") or copied <= cur.threshold:
        return []
    workers = max(int(count), 1)
    per_worker = copied / workers
    if per_worker < cfg.cow_min_per_worker:
        # No more than the start-up copy every worker makes, whatever its Dataset: no finding,
        # and no need to find the loaders (a listing of the heap, 40-100 ms, which a clean
        # fit's workers asked for once a run).
        return []
    held = inp.evidence.dataset_bytes()
    if held is not None and per_worker > SLACK * held:
        return []  # more than a worker can read: something else
    return [finding(ctx.origin, cur, rss, workers, copied, held)]


def finding(origin: Origin, cur: EpochStats, rss: EpochStats | None, workers: int,
            copied: float, held: float | None) -> Finding:
    bound = (f" (the Dataset's Python objects occupy about {fmt_bytes(held)}: a worker copies "
             "at most the pages it reads)" if held is not None else "")
    msg = (
        f"{where(METRIC)} rose by {fmt_bytes(copied)} more than their resident memory "
        f"({fmt_bytes(copied / workers)} per worker){bound}: that is copy-on-write, not "
        "a leak. Forked workers share the parent's pages until they touch them, and Python "
        "touches every object it reads (reference counts), so shared pages become private one "
        "by one (pytorch#13246). It stops when every page has been copied; summed RSS counts "
        "shared pages once per worker and overstates it, USS/PSS are the honest numbers."
    )
    return origin.finding(
        rule=NAME, kind="plateau", metric=METRIC, severity="info", message=msg,
        culprit=f"copy-on-write of the Dataset's Python objects in {workers} workers",
        suggestions=[
            "Keep the dataset in numpy arrays, a memmap or Arrow instead of lists/dicts of "
            "Python objects: their pages are never written, so they stay shared.",
        ],
        evidence={"pattern": "copy_on_write", "workers": workers, "uss_rise": copied,
                  "rss_rise": rss.rise if rss is not None else None,
                  "dataset_python_bytes": held},
    )


RULE: Rule[RuleInput] = Rule(name=NAME, kinds=frozenset({"plateau"}),
                             once=frozenset({"plateau"}), judge=judge,
                             reads=(METRIC, "workers.rss", COUNT))
