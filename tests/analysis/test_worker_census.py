"""Issue 41: inside the workers. Each DataLoader worker answers a census of its own Dataset, so
a per-worker leak names the Dataset's attribute that grows, per worker, by the second check
after the workers start (real persistent workers, tests/analysis/worker_census_loops.py), and a
bounded cache stays quiet. Unit tests of the censuses' halves and of the rule's use of them."""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

from loop_runs import LoopRuns
from memwatch.analysis.context import AnalyzerConfig
from memwatch.analysis.culprits import worker_census as WC
from memwatch.analysis.evidence import WorkerAttr, WorkerGrowth
from memwatch.analysis.rules import workers as rule
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.analysis.stats.trend import Trend

run_loop = LoopRuns(Path(__file__).with_name("worker_census_loops.py"))


def _worker_leaks(epochs: list[list[dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, f) for i, fs in enumerate(epochs) for f in fs
            if f["kind"] == "leak" and f["metric"] == "workers.uss"]


def test_a_per_worker_cache_is_named_by_the_second_check(tmp_path: Path) -> None:
    leaks = _worker_leaks(run_loop("cache", tmp_path))
    assert leaks, run_loop("cache", tmp_path)
    epoch, first = leaks[0]
    # workers start in epoch 0: its end is the first check (the trace: what the rule saw)
    assert epoch <= 1, (leaks, (tmp_path / "cache.json.trace").read_text()[-12000:])
    assert first["culprit"].startswith("`Augmenting.cache` in each DataLoader worker (dict, ")
    if "in the stretch before the workers saw the last check" in first["culprit"]:
        return  # epochs shorter than the workers' poll (a busy machine): the unit test below
    assert "per worker since the last check" in first["culprit"]
    assert first["suggestions"][0].startswith("`Augmenting.cache` grows in every worker")
    grown = first["evidence"]["worker_census"]["grown"][0]
    # 120 batches of 32 samples an epoch, split over 2 workers: 1,920 of 2 KiB each, a worker
    # (what a worker answered up to a fraction of a second before the check: these epochs last
    # about a second)
    assert grown["name"] == "Augmenting.cache" and 300 <= grown["len_delta"] <= 2100, grown
    per = grown["bytes_delta"] / grown["len_delta"]
    assert 2048 <= per <= 2600, grown  # 2 KiB tensors, weighed by their storage


def test_a_bounded_cache_in_the_workers_is_quiet(tmp_path: Path) -> None:
    epochs = run_loop("bounded", tmp_path)
    assert not _worker_leaks(epochs), epochs


class _Reader:
    def __init__(self) -> None:
        self.cache: dict[int, bytes] = {}


_GLOBAL_SEEN: list[int] = []


class _Data:
    table: dict[int, int] = {}  # noqa: RUF012 - a class attribute: every instance shares it

    def __init__(self) -> None:
        self.rows = list(range(10))
        self.reader = _Reader()
        self.memo = functools.lru_cache(maxsize=None)(lambda i: bytes(100))


def test_a_census_finds_the_datasets_containers_and_weighs_what_they_gained() -> None:
    ds = _Data()
    answers = WC._Answers(ds, seq=0)
    names = set(answers.now)
    assert {"_Data.rows", "_Data.reader.cache", "_Data.table", "_Data.memo",
            "test_worker_census._GLOBAL_SEEN"} <= names, names
    for i in range(50):
        ds.reader.cache[i] = bytes(4096)
        ds.memo(i)
    assert answers.update(seq=0)
    doc = answers.doc(os.getpid(), 0)
    cache = doc["attrs"]["_Data.reader.cache"]
    assert cache["len_delta"] == 50 and 50 * 4096 <= cache["bytes_delta"] <= 50 * 4400
    assert cache["element"] == "bytes objects"
    assert doc["attrs"]["_Data.memo"]["kind"] == "cache"
    assert doc["attrs"]["_Data.memo"]["len_delta"] == 50
    # a request marks the stretch: what grew before it is "before", what grows after it counts
    assert answers.update(seq=1)
    ds.reader.cache.update((i, b"") for i in range(50, 60))
    answers.update(seq=1)
    doc = answers.doc(os.getpid(), 0)
    assert doc["attrs"]["_Data.reader.cache"]["before"] == 50
    assert doc["attrs"]["_Data.reader.cache"]["len_delta"] == 10
    g = WC.summarize([doc, doc])
    assert g.answered == 2 and g.attrs[0].name == "_Data.reader.cache" and g.attrs[0].workers == 2


def test_the_main_process_asks_and_reads_answers(tmp_path: Path) -> None:
    folder = tmp_path / "workers"
    wc = WC.WorkerCensus(str(folder))
    if not WC.procfs.children_of(os.getpid()):  # no worker to ask: no folder, no request
        assert wc.ask().answered == 0 and not folder.exists()
    folder.mkdir(mode=0o700, exist_ok=True)
    doc = WC._Answers(_Data(), seq=0).doc(os.getpid(), 0)  # (this process stands in)
    (folder / f"{os.getpid()}.json").write_text(__import__("json").dumps(doc))
    (folder / "999999999.json").write_text("{}")  # a worker gone: dropped
    got = wc.ask()
    assert got.answered == 1 and got.datasets == ["_Data"]
    assert not (folder / "999999999.json").exists()
    assert (folder / "request").read_text() == str(wc.seq)


def test_a_check_reads_the_stretch_since_the_last_check_from_answers_to_its_request(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A worker (here a thread standing in for one) answers a request as soon as it reads it
    (every TICK_S) and the check waits for that answer: what grew between two checks is read
    at the second, however soon after the growth it comes (the 0.2-s poll alone left a check
    that came within a poll of the growth reading +0)."""
    import threading

    monkeypatch.setattr(WC, "ANSWER_WAIT_MIN_S", 30.0)  # the wait ends at the answers, not this
    monkeypatch.setattr(WC, "ANSWER_WAIT_MAX_S", 30.0)
    wc = WC.WorkerCensus(str(tmp_path / "workers"))
    ds, stop = _Data(), threading.Event()
    worker = WC._Answers(ds, wc._requested())
    wc._answer(worker.doc(os.getpid(), 0))

    def serve() -> None:
        while not stop.is_set():
            if worker.update(wc._next_request(worker.seq)):
                wc._answer(worker.doc(os.getpid(), 0))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        seen, added = [], 0
        for n in (30, 40, 50):
            ds.reader.cache.update((i, b"") for i in range(added, added + n))
            added += n
            g = wc.ask()  # at once: the worker has not polled since it grew
            a = next(a for a in g.attrs if a.name == "_Data.reader.cache")
            seen.append((a.len_delta, a.before, a.earlier))
            assert g.seqs == [wc.seq]
        assert seen == [(30, 0, 0), (40, 30, 0), (50, 40, 30)], seen
    finally:
        stop.set()
        t.join(5)


def test_an_answer_to_an_older_request_is_read_as_it_stands() -> None:
    """A worker that did not answer this check's request in time: its latest answer counts
    what grew since the request it saw (the stretch it measured), never the shifted one."""
    ds = _Data()
    answers = WC._Answers(ds, seq=0)
    ds.reader.cache.update((i, b"") for i in range(30))
    answers.update(seq=1)
    fresh = answers.doc(os.getpid(), 0)
    assert fresh["fresh"] and fresh["attrs"]["_Data.reader.cache"]["recent"] == 30
    got = WC.summarize([fresh], seq=1).attrs[0]
    assert (got.len_delta, got.before) == (30, 0) and got.bytes_delta > 0
    # the same answer read at the next check (seq 2): it saw request 1, +0 since
    got = WC.summarize([fresh], seq=2).attrs[0]
    assert (got.len_delta, got.before) == (0, 30)
    ds.reader.cache.update((i, b"") for i in range(30, 35))
    answers.update(seq=1)  # a poll: containers moved, no new request
    polled = answers.doc(os.getpid(), 0)
    assert not polled["fresh"] and "recent" not in polled["attrs"]["_Data.reader.cache"]
    got = WC.summarize([polled], seq=1).attrs[0]
    assert (got.len_delta, got.before) == (5, 30)


def _unit(growth: float, shape: str = "growing") -> EpochStats:
    tr = Trend(n=10, s=45.0, z=5.0, p=0.001, slope=growth / 99, slope_low=0.0, slope_high=0.0,
               intercept=0.0, r1=0.0, noise=0.0)
    return EpochStats(epoch=1, metric="workers.uss", n_points=10, n_steps=100,
                      seconds_per_step=0.01, level=1e9, floor=1e9, peak=1e9 + growth,
                      lo_start=1e9, lo_end=1e9 + growth, rise=growth, trend=tr, noise=0.0,
                      threshold=1.0, shape=shape, unit="e1")


def _grown(before: int, after: int, mib: float) -> WorkerGrowth:
    a = WorkerAttr("D.cache", "dict", 4000, after, mib * 2**20, "tensors", 2, before=before)
    return WorkerGrowth(answered=2, attrs=[a], datasets=["D"], seqs=[1])


def test_the_census_confirms_a_leak_only_when_a_container_keeps_growing() -> None:
    cfg = AnalyzerConfig()
    uss, rss = _unit(8 * 2**20), _unit(8 * 2**20)
    assert rule._held_in_census(_grown(2000, 2000, 4.0), [uss], rss, None, 2, cfg)
    # slower by more than half: a cache filling once, left to the series
    assert not rule._held_in_census(_grown(2000, 600, 4.0), [uss], rss, None, 2, cfg)
    # no growth before the last check (the workers just started): the series decides
    assert not rule._held_in_census(_grown(0, 2000, 4.0), [uss], rss, None, 2, cfg)
    # RSS flat while USS rises: copy-on-write, whatever grew in the Dataset
    flat = _unit(0.0, "flat")
    assert not rule._held_in_census(_grown(2000, 2000, 4.0), [uss], flat, None, 2, cfg)
    # a container that weighs a sliver of the growth does not explain it
    assert not rule._held_in_census(_grown(2000, 2000, 0.1), [uss], rss, None, 2, cfg)
    assert not rule._held_in_census(None, [uss], rss, None, 2, cfg)


def test_two_steps_of_the_workers_memory_leave_the_verdict_to_their_censuses() -> None:
    """Recorded (2 of 8 runs of the cache loop, in a fresh clone's suite too): the workers'
    USS rose as a step in both units (floors 18.2 then 33.5 MiB, rises 13.3 and 6.0), which
    the series alone calls nothing before a third unit; the censuses, which saw the cache grow
    in both stretches, were not asked, and the leak was confirmed a check late."""
    mib = 2**20
    e0, e1 = _unit(13.3 * mib, "step"), _unit(6.0 * mib, "step")
    assert rule._census_decides("none", [e0, e1])
    assert rule._census_decides("pending", [e0])
    assert not rule._census_decides("none", [e0, _unit(0.0, "flat")])  # nothing added
    assert not rule._census_decides("none", [e0, e1, e1])  # three units: the series' own
    assert not rule._census_decides("accumulation", [e0, e1])
    cfg = AnalyzerConfig()
    rss = _unit(5.8 * mib, "step")
    assert rule._held_in_census(_grown(1616, 1568, 3.4), [e1], rss, None, 2, cfg)
    # a step of USS that RSS did not follow is still copy-on-write
    assert not rule._held_in_census(_grown(1616, 1568, 3.4), [e1], _unit(0.0, "flat"), None, 2, cfg)


def _recorded(floor: float, lo_end: float, rise: float, shape: str, threshold: float,
              unit: str) -> EpochStats:
    mib = 2**20
    st = _unit(rise * mib, shape)
    return dataclasses.replace(st, floor=floor * mib, lo_end=lo_end * mib, rise=rise * mib,
                               lo_start=(lo_end - rise) * mib, threshold=threshold * mib,
                               unit=unit)


def test_a_unit_read_as_flat_that_held_what_it_added_is_left_to_the_censuses() -> None:
    """Recorded (3 of 6 quiet runs of the cache loop, and a CI run): the workers' USS in the
    second unit rose by 3.5 MiB between its first and last tenths, under its 4.5 MiB threshold
    (read as flat: the cache's pages came early in the unit), while its end stood 11 MiB above
    the first unit's end; the censuses had seen the cache grow in both stretches at the same
    pace and were not asked, and the leak came a check late. What the unit added and held
    (end floor to end floor) is what the censuses must explain, whatever its readings' spread.
    """
    e0 = _recorded(19.8, 32.9, 13.1, "growing", 5.95, "e0")
    e1 = _recorded(34.7, 44.0, 3.5, "flat", 4.5, "e1")
    r0 = _recorded(491.6, 500.0, 8.3, "growing", 4.9, "e0")
    r1 = _recorded(501.3, 510.0, 3.2, "flat", 5.0, "e1")
    assert rule._census_decides("none", [e0, e1])
    cfg = AnalyzerConfig()
    assert rule._held_in_census(_grown(1584, 1920, 4.06), [e0, e1], r1, r0, 2, cfg)
    # Without the previous unit, the flat unit's own rise is all there is: under its noise.
    assert not rule._held_in_census(_grown(1584, 1920, 4.06), [e1], r1, None, 2, cfg)
    # The end did not stand above the previous end: nothing held to explain.
    e1_back = _recorded(34.7, 33.0, 0.5, "flat", 4.5, "e1")
    assert not rule._census_decides("none", [e0, e1_back])
    assert not rule._held_in_census(_grown(1584, 1920, 4.06), [e0, e1_back], r1, r0, 2, cfg)
    # RSS's end did not follow USS's: copy-on-write, whatever the census saw.
    r1_flat = _recorded(501.3, 500.5, 0.2, "flat", 5.0, "e1")
    assert not rule._held_in_census(_grown(1584, 1920, 4.06), [e0, e1], r1_flat, r0, 2, cfg)


def test_a_stretch_the_workers_had_already_fed_does_not_hide_the_one_before() -> None:
    """Recorded in a full suite: a check at step 100 of a 120-step epoch, then the epoch's end;
    the workers, a poll late, had fed both before seeing either, so the stretch between them
    showed +0 (or +96) and the cache (+1,888, then +1,760) was confirmed one check late. The
    stretch before that one counts as "before the last check"; a cache filled once still
    levels off."""
    cfg = AnalyzerConfig()
    uss = _unit(8 * 2**20)

    def grown(earlier: int, before: int, after: int) -> WorkerGrowth:
        g = _grown(before, after, 4.0)
        g.attrs[0].earlier = earlier
        return g

    assert rule._held_in_census(grown(1888, 0, 1760), [uss], uss, None, 2, cfg)
    assert not rule._held_in_census(grown(1888, 0, 300), [uss], uss, None, 2, cfg)  # filled once
    assert not rule._held_in_census(grown(1888, 96, 300), [uss], uss, None, 2, cfg)
    # the workers just began
    assert not rule._held_in_census(grown(0, 0, 1760), [uss], uss, None, 2, cfg)
    # The worker keeps the stretch before the last two requests it saw.
    ds = _Data()
    answers = WC._Answers(ds, seq=0)
    ds.reader.cache.update((i, b"") for i in range(30))
    answers.update(seq=1)
    answers.update(seq=2)  # a stretch in which nothing was added
    ds.reader.cache.update((i, b"") for i in range(30, 40))
    answers.update(seq=2)
    entry = answers.doc(os.getpid(), 0)["attrs"]["_Data.reader.cache"]
    assert (entry["earlier"], entry["before"], entry["len_delta"]) == (30, 0, 10)
    assert WC.summarize([answers.doc(os.getpid(), 0)]).attrs[0].earlier == 30


def test_without_answers_the_culprit_says_why() -> None:
    culprit, _, ev = rule._held_in_workers(2, WorkerGrowth(answered=0))
    assert culprit.endswith("(no worker answered a census yet)") and ev["worker_census"]
    culprit, _, _ = rule._held_in_workers(2, WorkerGrowth(answered=2))
    assert "found no container of the Dataset that grew" in culprit
    culprit, _, ev = rule._held_in_workers(2, None)
    assert culprit.endswith("per-worker growth in the Dataset") and ev == {}
    assert dataclasses.asdict(_grown(1, 2, 1.0).attrs[0])["before"] == 1


def test_a_stretch_shorter_than_the_workers_poll_is_named_from_the_stretch_before() -> None:
    """Recorded in a full suite (epochs of 0.3 s): both workers saw the latest request after
    they had made all of the stretch's samples, so their answers said +0 since it and +1,888
    before it, and the culprit read "found no container of the Dataset that grew". The growth
    before the request a worker saw names the container; it confirms nothing on its own."""
    answers = [{"pid": 10 + w, "worker": w, "seq": 2, "dataset": "Augmenting", "attrs": {
        "Augmenting.cache": {"kind": "dict", "len": 1920 * 2, "len_delta": 0, "before": 1888},
        "Augmenting.rows": {"kind": "list", "len": 10, "len_delta": 0, "before": 0}}}
        for w in (0, 1)]
    got = WC.summarize(answers)
    assert [a.name for a in got.attrs] == ["Augmenting.cache"] and got.attrs[0].before == 1888
    culprit, fix, _ = rule._held_in_workers(2, got)
    assert culprit.startswith("`Augmenting.cache` in each DataLoader worker (dict, "), culprit
    assert "+1,888 per worker in the stretch before" in culprit and "2 of 2" in culprit
    assert fix.startswith("`Augmenting.cache` grows in every worker")
    uss = _unit(8 * 2**20)
    assert not rule._held_in_census(got, [uss], uss, None, 2, AnalyzerConfig())
    # Growth since the request (in any worker) is what is named when there is some.
    answers[1]["attrs"]["Augmenting.rows"].update(len_delta=5, bytes_delta=40.0)
    assert [a.name for a in WC.summarize(answers).attrs] == ["Augmenting.rows"]
