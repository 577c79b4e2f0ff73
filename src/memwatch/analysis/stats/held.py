"""Held growth: the confirmation rule every leak verdict shares.

A unit (an epoch, or the stretch between two checks) that grows is only a *leak* once the next
unit shows that growth is still held: its floor sits above the previous unit's floor by at least
``carry_fraction`` of what the previous unit gained. Growth released at the unit's end is
*accumulation*; growth that slows down unit after unit is *decelerating* (a cache filling);
floors that climb by similar amounts, unit after unit, are a leak even when no single unit
shows a significant trend (RSS rises in stairs while the C allocator fills its free lists).
"""

from __future__ import annotations

import numpy as np

from memwatch.analysis.stats.shapes import EpochStats

__all__ = ["floor_rose", "verdict", "worth_reporting"]


def verdict(hist: list[EpochStats], carry_fraction: float, deceleration: float) -> str:
    """'leak', 'accumulation', 'decelerating', 'pending' or 'none' for the latest unit:
    ``carry_fraction`` is the share of the previous unit's rise that must still be held,
    ``deceleration`` the share of its slope under which growth is saturating
    (:class:`memwatch.AnalyzerConfig`'s fields of those names)."""
    cur = hist[-1]
    prev = hist[-2] if len(hist) >= 2 else None
    if prev is not None:
        prev_gain = max(prev.rise, prev.growth if prev.shape == "growing" else 0.0)
        held = cur.floor - prev.floor
        # The previous unit rose, and this one still holds (most of) that rise.
        carried = prev_gain > prev.threshold and held >= carry_fraction * prev_gain
    if cur.shape == "growing":
        if prev is None:
            return "pending"  # one epoch cannot tell a leak from epoch-scoped accumulation
        # A saturating curve (a cache filling, pools settling) keeps growing, only slower every
        # epoch: a leak keeps its rate.
        decelerating = prev.shape == "growing" and \
            cur.trend.slope_high < deceleration * prev.slope
        if carried and held > cur.threshold * 0.5 and not decelerating:
            return "leak"
        if decelerating:
            return "decelerating"
        if prev_gain > prev.threshold and held < 0.25 * prev_gain:
            return "accumulation"
        return "pending"
    if cur.shape == "step" and prev is not None and prev.shape == "growing":
        # A steady rise, held, then a stair of the same order: RSS of a leaking process often
        # stalls while the allocator hands out memory it already had (freed by earlier code),
        # then jumps when that runs out. Two units in a row added held memory of similar size.
        if carried and cur.rise > cur.threshold and cur.rise >= 0.4 * prev_gain:
            return "leak"
    # Slow or stair-like leaks: RSS often rises in jumps (the C allocator fills its free pools
    # first, then grows the heap), so no single epoch shows a steady trend; the epoch floors
    # still climb, epoch after epoch, by similar amounts.
    if len(hist) >= 3 and cur.shape in ("flat", "growing", "step"):
        floors = np.array([h.floor for h in hist[-3:]])
        inc = np.diff(floors)
        thr = max(h.threshold for h in hist[-3:])
        # Similar amounts, within 2.5x either way: a small creep followed by one large jump
        # is memory taken once (a buffer allocated in the third unit), not a climb. And the
        # latest unit added memory: it ends above where the previous one ended. A floor counts
        # what the units before it added, so a unit that only holds the previous unit's rise
        # (a clean fit's allocator warming up over two 4-s epochs: floors 420, 542, 646 MiB,
        # the last 646 from its first step to its last) shows a climb its own end does not.
        if (inc > thr).all() and 0.4 * inc[0] <= inc[-1] <= inc[0] / 0.4 and \
                prev is not None and cur.lo_end - prev.lo_end > thr:
            return "leak"
    return "none"


def worth_reporting(cur: EpochStats, amount: float, min_bytes: float, min_rel: float) -> bool:
    """Informational findings only for changes a person would care about: at least
    ``min_bytes`` and ``min_rel`` of the level."""
    return amount >= max(min_bytes, min_rel * abs(cur.level))


def floor_rose(hist: list[EpochStats]) -> bool:
    """The last unit's floor sits above the previous unit's by more than its noise."""
    return len(hist) >= 2 and hist[-1].floor - hist[-2].floor > hist[-1].threshold
