"""The live evidence's cost estimate: the heap is listed to count it only when it may have
changed a lot (a framework's heap takes tens of milliseconds to list; checks that decide against
a census must not pay that every time); in between it is scaled by the allocator's blocks."""

from __future__ import annotations

import gc

import pytest

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
    blocks[0] = 1_500_000  # within a doubling: the count is scaled, not listed
    assert ev.object_count() == round(first * 1.5) and ev.census_cost() > 0
    assert len(listed) == 1
    blocks[0] = 2_100_000  # past twice the blocks it was counted at: listed again
    ev.object_count()
    assert len(listed) == 2


def test_the_first_check_asks_whether_the_heap_is_too_large_without_listing_it(
        monkeypatch) -> None:
    listed = []
    real = gc.get_objects

    def counting() -> list[object]:
        listed.append(1)
        return real()

    monkeypatch.setattr(live.gc, "get_objects", counting)
    ev = LiveEvidence()
    blocks = live.sys.getallocatedblocks()
    # The allocator's blocks bound the tracked objects: a cap above them is answered by them.
    assert len(real()) <= blocks
    assert ev.object_count(at_most=blocks + 10) <= blocks + 10 and listed == []
    # A cap below them: not known without a listing, and none is made to tell.
    assert ev.object_count(at_most=10) is None and listed == []
    # A census given the cap lists the heap once, walks nothing past it, and keeps the count.
    assert ev.census(collect=False, count_types=True, epoch=0, step=1, rss=0.0,
                     at_most=10) is None
    assert listed == [1] and ev.last_census_ms is None
    counted = ev.last_objects
    assert counted is not None and counted > 10
    assert (ev.object_count(at_most=10) or 0) == pytest.approx(counted, rel=0.05)
    assert listed == [1]
    # Under the cap, the census is taken from that one listing.
    assert ev.census(collect=False, count_types=True, epoch=0, step=2, rss=0.0,
                     at_most=10**9) is None  # (the first census: no pair yet)
    assert listed == [1, 1] and ev.last_census_ms is not None


def test_a_census_sets_the_count_and_the_cost_per_object() -> None:
    ev = LiveEvidence()
    ev.census(collect=False, count_types=True, epoch=0, step=1, rss=0.0)
    assert ev.last_objects and ev.last_census_ms is not None and ev.last_census_cpu
    # the estimate is in CPU seconds per object walked (what a busy machine does not stretch)
    assert ev.last_objects_walked == ev.last_objects
    # (the objects counted then, scaled by the allocator's blocks since: a few more by now)
    per_object = ev.last_census_cpu / ev.last_objects_walked
    assert abs(ev.census_cost() / (ev.last_objects * per_object) - 1) < 0.1


def test_a_dataset_is_weighed_once_per_generation_of_workers(monkeypatch) -> None:
    """Finding the loaders walks the heap: the weight is kept while the same worker processes
    live (they copy what they forked with) and weighed again when they change."""
    weighed, kids = [], [[101, 102]]
    monkeypatch.setattr(live, "dataset_bytes", lambda: weighed.append(1) or 4096.0)
    monkeypatch.setattr(live.procfs, "children_of", lambda pid: list(kids[0]))
    ev = LiveEvidence()
    assert ev.dataset_bytes() == 4096.0 and ev.dataset_bytes() == 4096.0
    assert len(weighed) == 1
    kids[0] = [103, 104]  # a new generation (non-persistent workers, the next epoch)
    ev.dataset_bytes()
    assert len(weighed) == 2
    kids[0] = []  # no workers: nothing to keep, weighed each time it is asked
    ev.dataset_bytes()
    ev.dataset_bytes()
    assert len(weighed) == 4
