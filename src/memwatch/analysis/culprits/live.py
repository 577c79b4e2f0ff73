"""The live process as evidence: the one implementation of
:class:`memwatch.analysis.evidence.Evidence` that walks the heap and reads ``/proc``.

A session makes one and hands it to its analyzer; it keeps the censuses of the last two checks
(memory stays bounded: two censuses, whatever the run length) so that each check's verdicts can
diff them.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Any

from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.culprits import killer
from memwatch.analysis.culprits.attribution import attribute
from memwatch.analysis.culprits.census import census as census_mod
from memwatch.analysis.culprits.growth.traced import attribute_traced
from memwatch.analysis.culprits.holders.loaders import dataset_bytes, loaders_with_workers
from memwatch.analysis.culprits.worker_census import WorkerCensus
from memwatch.analysis.evidence import (
    Attribution,
    CensusPair,
    CensusRecord,
    Holder,
    HolderSize,
    WorkerGrowth,
)
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.costs import Costs
from memwatch.probes import procfs

__all__ = ["LiveEvidence"]

#: CPU seconds per object walked, until this run's first census measured its own: 0.4 us was
#: measured on the development machine (290,000- and 365,000-object heaps of a plain loop and a
#: Lightning fit, quiet; see benchmarks/bench_census_walks.py); 1 us leaves room for a slower
#: machine. It decides whether a weak sign's first census fits the budget.
_SECONDS_PER_OBJECT = 1e-6

log = logging.getLogger("memwatch")
#: Holders named by attributions that a later check may measure again.
_HOLDERS_KEPT = 16


class LiveEvidence:
    """Censuses, attributions, DataLoader workers and mapped files of this process.

    Example::

        >>> from memwatch.analysis.culprits.live import LiveEvidence
        >>> ev = LiveEvidence()
        >>> ev.census(collect=False, count_types=True, epoch=0, step=10, rss=0.0) is None
        True
        >>> pair = ev.census(collect=False, count_types=True, epoch=1, step=20, rss=0.0)
        >>> [r.step for r in pair], ev.last_census_ms is not None
        ([10, 20], True)
    """

    def __init__(self, costs: Costs | None = None, workers_dir: str | None = None,
                 share: str = "private") -> None:
        self._censuses: list[CensusRecord] = []
        #: The DataLoader workers' own censuses (None: not asked, or the folder is unusable).
        self._workers: WorkerCensus | None = None
        if workers_dir is not None:
            try:
                self._workers = WorkerCensus(workers_dir, share)
            except Exception as e:  # noqa: BLE001 - evidence only
                log.warning("memwatch: DataLoader workers will not answer censuses (%s): a "
                            "worker's leak is not named", e)
        self._costs = costs if costs is not None else Costs()
        #: Objects the last census walked (None until one ran).
        self.last_objects: int | None = None
        self._blocks = 0  # the allocator's block count when last_objects was counted
        #: Milliseconds the last census took (None until one ran).
        self.last_census_ms: float | None = None
        #: CPU seconds the last census took, on the thread that ran it (None until one ran),
        #: and the objects it walked.
        self.last_census_cpu: float | None = None
        self.last_objects_walked = 0
        self._dataset: tuple[frozenset[int], float | None] | None = None
        #: The holders attributions named, by path (the latest few): measured again at later
        #: checks through the weak way back each one keeps.
        self._holders: dict[str, Holder] = {}

    def object_count(self, at_most: int | None = None) -> int | None:
        """Objects the next census would walk, estimated. Listing a framework's heap (200,000
        objects and more) to count it takes 15-30 ms, which checks that decide against a census
        paid five times in a 3-epoch fit (the allocator's blocks moved by more than the quarter
        that used to trigger a new listing). The count of the last census or listing is scaled
        by the allocator's block count since then (a read of microseconds: gc objects are most
        of its blocks), and the heap is listed again only when that count has halved or
        doubled, where a changed mix of objects could make the scaled figure wrong by more.

        Before any census or listing, a question ``at_most`` is answered by the blocks
        themselves where they are few enough: every object the collector tracks is one of the
        allocator's blocks, so they bound the count, and a run's first check (which asks
        whether the heap is past ``census_max_objects`` before its baseline census) lists
        nothing twice. Where they are more (a framework's heap: 1.3 million blocks for
        350,000 objects), None: the census, given ``at_most``, lists the heap once and tells
        (a listing before it cost 60 ms of a clean 12-s fit, and the census listed it again)."""
        blocks = sys.getallocatedblocks()
        if self.last_objects is None and at_most is not None:
            return blocks if blocks <= at_most else None
        if self.last_objects is None or not self._blocks or \
                not 0.5 <= blocks / self._blocks <= 2.0:
            self.last_objects = len(gc.get_objects())
            self._blocks = blocks
            return self.last_objects
        return round(self.last_objects * blocks / self._blocks)

    def census_cost(self) -> float:
        """The next census's estimated CPU seconds: objects to walk times the last census's CPU
        seconds per object (a constant before any census). CPU time, not wall: a busy machine
        does not make a census look dearer (see memwatch.core.costs)."""
        objects = self.object_count() or 0
        walked = self.last_objects_walked
        per_object = (self.last_census_cpu / walked
                      if self.last_census_cpu and walked else _SECONDS_PER_OBJECT)
        return objects * per_object

    def census(self, *, collect: bool, count_types: bool, epoch: int, step: int,
               rss: float, at_most: int | None = None) -> CensusPair | None:
        before = self._costs.cpu.get("census", 0.0)
        try:
            with self._costs.timed("census"):
                c = census_mod.take_census(collect=collect, count_types=count_types,
                                           max_objects=at_most)
        except census_mod.TooManyObjects as e:
            self.last_objects, self._blocks = e.objects, sys.getallocatedblocks()
            return None
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: tensor census failed (%s); culprits will not be named", e)
            return None
        self.last_census_cpu = self._costs.cpu["census"] - before  # what timed() measured
        self.last_objects_walked = c.objects
        self.last_objects = c.objects
        self._blocks = sys.getallocatedblocks()
        self.last_census_ms = c.elapsed_ms
        rec = CensusRecord(epoch, c, rss, step=step)
        killer.remember(rec, killer.in_use())  # the baseline of what a failure names
        prev = self._censuses[-1] if self._censuses else None
        self._censuses = [*self._censuses[-1:], rec]  # keep two: memory stays bounded
        return None if prev is None else (prev, rec)

    def attribute(self, metric: str, cur: EpochStats, pair: CensusPair | None,
                  ctx: CheckContext, cfg: AnalyzerConfig, growth: float,
                  trace: Any = None) -> Attribution:
        with self._costs.timed("attribution"):
            out = attribute(metric, cur, pair, ctx, cfg, growth=growth)
            if trace is not None:
                attribute_traced(out, cur, trace, cfg)
        h = out.holder
        if h is not None and h.measure is not None:
            self._holders.pop(h.path, None)
            self._holders[h.path] = h
            for old in list(self._holders)[:-_HOLDERS_KEPT]:
                del self._holders[old]
        return out

    def holder_size(self, path: str) -> HolderSize | None:
        h = self._holders.get(path)
        if h is None or h.measure is None:
            return None
        try:
            return h.measure()
        except Exception:  # noqa: BLE001 - evidence only
            return None

    def loaders_with_workers(self) -> tuple[int, Holder | None]:
        return loaders_with_workers()

    def dataset_bytes(self) -> float | None:
        """What the Datasets of the loaders with live workers hold, weighed once per generation
        of worker processes: the workers copy what they forked with, and finding the loaders
        walks the heap (a clean fit's start-up copying asked at every check: 75-110 ms each)."""
        with self._costs.timed("attribution"):
            try:
                kids: frozenset[int] | None = frozenset(procfs.children_of(os.getpid()))
            except Exception:  # noqa: BLE001 - evidence only: weigh again
                kids = None
            if kids and self._dataset is not None and self._dataset[0] == kids:
                return self._dataset[1]
            got = dataset_bytes()
            self._dataset = (kids, got) if kids else None
            return got

    def mapped_files(self) -> list[tuple[str, float]] | None:
        """The data files most resident now (one ``smaps`` read, milliseconds: once per
        finding); None off Linux."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return procfs.read_mapped_files(os.getpid(), top=10_000)
        except Exception:  # noqa: BLE001 - evidence only; never fail a check over it
            log.debug("memwatch: reading /proc/self/smaps failed", exc_info=True)
            return []

    def worker_growth(self) -> WorkerGrowth | None:
        """The workers' latest censuses, and a request for the next (files: milliseconds)."""
        if self._workers is None:
            return None
        with self._costs.timed("attribution"):
            return self._workers.ask()

    def alloc_conf(self) -> str:
        return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get(
            "PYTORCH_ALLOC_CONF", "")
