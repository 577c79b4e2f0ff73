"""When a unit's DataLoader workers were all up: the part of a unit in which workers were still
starting is no evidence about them; and whether their number keeps rising from check to check
(:func:`count_rising`: more workers, not bigger ones).

A worker's own start-up (imports, unpickling the Dataset, its first batches) makes its memory
rise in any training: judging the workers' series from the start of the unit in which they
started would read that rise as growth. Their statistics start where every worker counted in
the unit was alive and their resident memory had made nine tenths of its rise (under load the
start-up lasts longer, so the tail of the rise, not a fixed share of the unit, decides), plus a
tenth of the unit.
"""

from __future__ import annotations

import numpy as np

from memwatch.analysis.stats.shapes import EpochStats
from memwatch.timeline import EpochSummary

__all__ = ["COUNT", "copied_since_all_up", "count_rising", "workers_settled_step"]

#: The number of live DataLoader worker processes.
COUNT = "workers.count"


def count_rising(count: list[EpochStats]) -> bool:
    """The worker count's floor rose at each of the last two checks (by a whole worker or
    more): workers that multiply (DataLoaders built again and kept), not workers that grow."""
    if len(count) < 3:
        return False
    f = [h.floor for h in count[-3:]]
    return f[1] >= f[0] + 1 and f[2] >= f[1] + 1


def workers_settled_step(summary: EpochSummary, min_growth: float) -> int | None:
    """The first step of ``summary`` from which its workers were all up and settled; None when
    the count did not rise within the unit (every worker was alive from its start), when they
    settled only in the last quarter of it, or the series are missing."""
    keys = summary.keys
    if "workers.count" not in keys or "workers.rss" not in keys or summary.bucket_floor is None:
        return None
    steps, cnt = summary.series("workers.count", "floor")
    _, rss = summary.series("workers.rss", "floor")
    ok = ~(np.isnan(cnt) | np.isnan(rss))
    steps, cnt, rss = steps[ok], cnt[ok], rss[ok]
    if len(cnt) < 6 or cnt.max() <= 0 or cnt[0] >= cnt.max():
        return None
    full = int(np.nonzero(cnt >= cnt.max())[0][0])
    k = max(2, len(cnt) // 10)
    rss_max = float(np.max(rss[full:]))
    settle = rss_max - max(min_growth, 0.1 * (rss_max - float(rss[full])))
    first = full + max(k, int(np.nonzero(rss[full:] >= settle)[0][0]))
    if len(cnt) - first < max(6, len(cnt) // 4):
        # Workers kept starting until near the end (a loader built at every evaluation): too
        # little settled time to judge alone. The whole unit is kept; the workers rules leave
        # such units out by their count (a unit whose count floor is below today's).
        return None
    return int(steps[first])


def copied_since_all_up(summary: EpochSummary) -> float | None:
    """Bytes the unit's workers turned from shared to private since every one of them was up:
    the rise of their summed USS less the rise of their summed RSS, from the first bucket where
    the count reached its maximum to the last (None when the count did not stay there, or the
    series are missing).

    A page a worker allocates raises both its USS and its RSS; a shared page it writes to
    (copy-on-write) was resident already, so it raises the USS alone. The difference is
    therefore the copying, start-up included, and it does not depend on when the start-up
    ended: the settled window of :func:`workers_settled_step` comes later on a loaded machine
    and sees less of the copying, which is done by then."""
    keys = summary.keys
    if not {"workers.count", "workers.rss", "workers.uss"} <= set(keys) or \
            summary.bucket_last is None:
        return None
    _, cnt = summary.series("workers.count", "last")
    _, rss = summary.series("workers.rss", "last")
    _, uss = summary.series("workers.uss", "last")
    ok = ~(np.isnan(cnt) | np.isnan(rss) | np.isnan(uss))
    cnt, rss, uss = cnt[ok], rss[ok], uss[ok]
    if len(cnt) < 2 or cnt.max() <= 0:
        return None
    full = int(np.nonzero(cnt >= cnt.max())[0][0])
    if full >= len(cnt) - 1 or np.any(cnt[full:] != cnt.max()):
        return None
    return float((uss[-1] - uss[full]) - (rss[-1] - rss[full]))
