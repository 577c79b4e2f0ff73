"""The live evidence's cost estimate: the heap is listed to count it only when it may have
changed (a framework's heap takes tens of milliseconds to list; checks that decide against a
census must not pay that every time)."""

from __future__ import annotations

import gc

from memwatch.analysis.culprits import live
from memwatch.analysis.culprits.live import LiveEvidence


def test_the_object_count_is_listed_again_only_when_the_heap_changed(monkeypatch) -> None:
    listed = []
    real = gc.get_objects

    def counting() -> list[object]:
        listed.append(1)
        return real()

    blocks = [1_000_000]
    monkeypatch.setattr(live.gc, "get_objects", counting)
    monkeypatch.setattr(live.sys, "getallocatedblocks", lambda: blocks[0])
    ev = LiveEvidence()
    first = ev.object_count()
    assert first > 0 and len(listed) == 1
    blocks[0] = 1_200_000  # within a quarter: the count stands
    assert ev.object_count() == first and ev.census_cost() > 0 and len(listed) == 1
    blocks[0] = 1_300_000  # past a quarter of the blocks it was counted at: listed again
    ev.object_count()
    assert len(listed) == 2


def test_a_census_sets_the_count_and_the_cost_per_object() -> None:
    ev = LiveEvidence()
    ev.census(collect=False, count_types=True, epoch=0, step=1, rss=0.0)
    assert ev.last_objects and ev.last_census_ms is not None and ev.last_census_cpu
    # the estimate is in CPU seconds per object walked (what a busy machine does not stretch)
    assert ev.last_objects_walked == ev.last_objects
    assert ev.census_cost() == ev.last_objects * (ev.last_census_cpu / ev.last_objects)
