"""A recorded stand-in for the live process: test a rule without a process to look at.

:class:`RecordedEvidence` implements :class:`memwatch.analysis.evidence.Evidence` with values given
up front (what an attribution found, how much a Dataset holds, which files are mapped) and
records what the analyzer asked of it, so a test can drive :class:`memwatch.analysis.Analyzer`
over scripted summaries and check both the verdicts and the instruments they took.

Example::

    >>> from memwatch.analysis import Analyzer, CheckContext
    >>> from memwatch.testing.evidence import RecordedEvidence
    >>> from memwatch.timeline import Timeline
    >>> ev = RecordedEvidence()
    >>> tl, analyzer = Timeline(["host.rss"]), Analyzer(evidence=ev)
    >>> for epoch in range(2):
    ...     for s in range(200):
    ...         tl.append(epoch * 200 + s, float(s), [2**30 + float(epoch * 200 + s) * 2**20])
    ...     _ = analyzer.check(tl.end_epoch(), CheckContext())
    >>> ev.censuses  # steady growth at both checks: a census each time
    2
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.evidence import (
    Attribution,
    Census,
    CensusPair,
    CensusRecord,
    Holder,
    HolderSize,
    WorkerGrowth,
)
from memwatch.analysis.stats.shapes import EpochStats

__all__ = ["RecordedEvidence"]


@dataclasses.dataclass
class RecordedEvidence:
    """Evidence from values given up front.

    Attributes:
        attribution: what :meth:`attribute` answers (a copy, with the growth it was asked to
            explain as ``rss_growth_bytes`` when none is set); the default explains nothing.
        objects: the object count a census would walk; ``seconds_per_object`` its cost.
        dataset: what :meth:`dataset_bytes` answers; ``loaders`` what
            :meth:`loaders_with_workers` answers; ``files`` what :meth:`mapped_files` answers;
            ``workers`` what :meth:`worker_growth` answers.
        sizes: what :meth:`holder_size` answers, by holder path (set it between checks to
            script a holder that grows, fills its bound or stops).
        censuses, attributions: how many of each the analyzer asked for.
    """

    attribution: Attribution | None = None
    objects: int = 100_000
    seconds_per_object: float = 1e-6
    dataset: float | None = None
    loaders: tuple[int, Holder | None] = (0, None)
    files: list[tuple[str, float]] | None = None
    workers: WorkerGrowth | None = None
    conf: str = ""
    sizes: dict[str, HolderSize] = dataclasses.field(default_factory=dict)
    censuses: int = 0
    attributions: int = 0
    _last: CensusRecord | None = None

    def object_count(self, at_most: int | None = None) -> int | None:
        return self.objects

    def census_cost(self) -> float:
        return self.objects * self.seconds_per_object

    def census(self, *, collect: bool, count_types: bool, epoch: int, step: int,
               rss: float, at_most: int | None = None) -> CensusPair | None:
        if at_most is not None and self.objects > at_most:
            return None
        self.censuses += 1
        rec = CensusRecord(epoch, Census({}, 0, {}, self.objects, collections.Counter(), 0.0,
                                         time.time()), rss, step=step)
        prev, self._last = self._last, rec
        return None if prev is None else (prev, rec)

    def attribute(self, metric: str, cur: EpochStats, pair: CensusPair | None,
                  ctx: CheckContext, cfg: AnalyzerConfig, growth: float,
                  trace: Any = None) -> Attribution:
        self.attributions += 1
        base = self.attribution or Attribution(explained_bytes=0.0, retention=True)
        out = dataclasses.replace(base)
        if out.rss_growth_bytes is None and metric.startswith("host."):
            out.rss_growth_bytes = growth
        return out

    def loaders_with_workers(self) -> tuple[int, Holder | None]:
        return self.loaders

    def dataset_bytes(self) -> float | None:
        return self.dataset

    def mapped_files(self) -> list[tuple[str, float]] | None:
        return self.files

    def worker_growth(self) -> WorkerGrowth | None:
        return self.workers

    def alloc_conf(self) -> str:
        return self.conf

    def holder_size(self, path: str) -> HolderSize | None:
        return self.sizes.get(path)
