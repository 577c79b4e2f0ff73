"""Growth into a container that carries its own bound: a ``collections.deque(maxlen=N)`` that is
filling, an ``functools.lru_cache(maxsize=N)`` that has not reached its size. Such memory stops
growing at the bound, whatever the run does: judged with that bound it is a plateau to come,
not a leak, unless the run's limit comes first (then the leak verdict stands, with advice that
never asks for a bound the holder already has).

A part of the leak rule (:mod:`.rule`): it runs at a leak verdict whose census named the holder.
"""

from __future__ import annotations

from memwatch.analysis.evidence import Attribution, Bound
from memwatch.analysis.rules.base import SubRule
from memwatch.analysis.rules.words import limit_words, where
from memwatch.core.findings import Finding, Origin
from memwatch.core.units import fmt_bytes

__all__ = ["NAME", "PART", "per_item", "to_bound"]

NAME = "bounded"
PART = SubRule(name=NAME, kinds=frozenset({"plateau"}))
#: The bounded holder must hold this share of what live objects gained between the censuses (of
#: the growth judged, where the census weighed nothing) to take the leak verdict's place: the
#: complement of ``AnalyzerConfig.retention_explained`` (growth below that share is not theirs),
#: so no more than that share is left to anything else growing beside it.
BOUND_EXPLAINS = 0.8


def per_item(a: Attribution, growth: float) -> float | None:
    """Bytes each item the holder gained holds: what grew between the censuses over the items
    it gained meanwhile (None when it gained none that the census counted)."""
    h = a.holder
    gained = h.owner_delta if h is not None and h.owner_delta is not None else \
        a.container.len_delta if a.container is not None else \
        a.group.count_delta if a.group is not None else None
    if not gained or gained <= 0:
        return None
    grew = a.chosen.bytes if a.chosen is not None and a.chosen.bytes > 0 else growth
    return max(float(grew), 0.0) / gained


def to_bound(*, origin: Origin, metric: str, a: Attribution, growth: float, slope: float,
             peak_now: float, limit: float | None, limit_name: str | None) -> Finding | None:
    """The plateau to come when the named holder carries a bound and what it will hold there
    fits under the limit (a holder that just filled it included); None otherwise (no bound,
    nothing to project from, or the limit comes first: a leak)."""
    h = a.holder
    b: Bound | None = h.bound if h is not None else None
    if h is None or b is None:
        return None
    gained = a.explained_bytes if a.explained_bytes else growth
    if a.chosen is not None and a.chosen.bytes < BOUND_EXPLAINS * gained:
        return None  # something else grows beside it: the leak verdict stands
    each = per_item(a, growth)
    if each is None and not b.full:
        return None
    more = b.left * each if each is not None else 0.0
    final = peak_now + more
    if limit is not None and final >= limit:
        return None
    lim = "" if limit is None else f", within {limit_words(limit, limit_name)}"
    now = (f"full now ({b.capacity:,} items)" if b.full else
           f"{b.length:,} of {b.capacity:,} items now")
    each_words = f", about {fmt_bytes(each)} each" if each is not None else ""
    msg = (f"{where(metric)} grew by {fmt_bytes(slope)} per step into `{h.path}`, which is "
           f"bounded ({b.describe()}): {now}{each_words}. It stops growing when full"
           + (f", about {fmt_bytes(more)} more (to ~{fmt_bytes(final)}{lim})" if more else "")
           + ". Not a leak.")
    return origin.finding(
        rule=NAME, kind="plateau", metric=metric, severity="info", message=msg,
        bytes_per_step=slope, culprit=h.describe(h.owner_delta),
        evidence={"pattern": "bounded", "holder": h.path, "holder_bound": b.to_dict(),
                  "holder_len": b.length, "bytes_per_item": each, "bytes_to_bound": more,
                  "level_at_bound": final, "limit_bytes": limit, "limit_name": limit_name})
