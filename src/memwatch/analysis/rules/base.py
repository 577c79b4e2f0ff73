"""The shape every rule has, what it is handed, and the one de-duplication policy.

A rule is a :class:`Rule` value: a name, the finding kinds it may return, which of them are said
once per run, and a ``judge`` function of one :class:`RuleInput`. The input is everything a
verdict may use: this check's summary and statistics, the units judged per metric, the check's
context and tuning, and the :class:`~memwatch.analysis.context.Evidence` port (the only way a
rule learns anything about the live process). A rule never walks the heap or reads ``/proc``
itself (``tests/test_architecture.py`` checks its imports), so it can be tested from recorded
values.

Example (a rule is a value; :data:`memwatch.analysis.rules.RULES` lists the ones that run)::

    >>> from memwatch.analysis.rules import RULES
    >>> [r.name for r in RULES]
    ['leak', 'workers', 'copy_on_write', 'fragmentation', 'outside_allocator', 'near_oom']
    >>> sorted(RULES[0].kinds)[:3]
    ['accumulation', 'allocator_retention', 'leak']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from memwatch.analysis.context import AnalyzerConfig, CheckContext, Evidence
from memwatch.analysis.culprits.evidence import Attribution, CensusPair
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Finding
from memwatch.timeline import EpochSummary

__all__ = ["Rule", "RuleInput", "dedupe"]


@dataclasses.dataclass(frozen=True)
class RuleInput:
    """What one check hands every rule.

    Attributes:
        summary: the unit that just ended (an epoch, or the segment since the previous check).
        history: per metric, the units a verdict compares, oldest first; the last is this
            check's (see :meth:`memwatch.analysis.Analyzer.check` for which units those are).
        stats: per metric, this check's statistics (``history[m][-1]`` unless the check judged
            the epoch so far).
        ctx: the check's context (origin, limits, run length, census mode, allocation sites).
        cfg: the analyzer's tuning.
        evidence: the port to the live process.
        pair: the censuses of this check and the previous one, when both were taken.
    """

    summary: EpochSummary
    history: Mapping[str, list[EpochStats]]
    stats: Mapping[str, EpochStats]
    ctx: CheckContext
    cfg: AnalyzerConfig
    evidence: Evidence
    pair: CensusPair | None = None

    def attribute(self, metric: str, cur: EpochStats, growth: float) -> Attribution:
        """What explains ``growth`` bytes of ``metric`` between this check's two censuses
        (tracemalloc's allocation sites too, for host metrics when tracing)."""
        trace = self.ctx.trace if metric.startswith("host.") else None
        return self.evidence.attribute(metric, cur, self.pair, self.ctx, self.cfg, growth,
                                       trace)

    def mapped_files(self) -> list[tuple[str, float]] | None:
        """The data files mapped now (the context's scripted list, or the evidence's read;
        None where the system cannot list them)."""
        if self.ctx.mapped_files is not None:
            return self.ctx.mapped_files()
        return self.evidence.mapped_files()


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule of the analyzer.

    Attributes:
        name: how docs, tests and logs name it.
        kinds: the finding kinds it may return (each in :data:`memwatch.core.findings.KINDS`).
        once: of those kinds, the ones said once per (metric, kind) for the whole run: a
            benign shape (a plateau, accumulation) is news once; a leak's figures (rate,
            forecast, culprit) are news at every check.
        judge: the verdicts of one check.
        reads: the metrics it judges (documentation; the analyzer hands it all).
    """

    name: str
    kinds: frozenset[str]
    once: frozenset[str]
    judge: Callable[[RuleInput], list[Finding]]
    reads: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.once <= self.kinds:
            raise ValueError(f"rule {self.name}: once={sorted(self.once)} must be among its "
                             f"kinds {sorted(self.kinds)}")


def dedupe(found: Iterable[tuple[Rule, Finding]], said: set[tuple[str, str]]) -> list[Finding]:
    """The one policy for findings said twice.

    * Across checks: a finding of a kind its rule says once is dropped when (metric, kind) was
      said before (``said`` is updated).
    * Within one check: of findings with the same kind and culprit, only the one with the
      largest rate is kept (the same growth seen through two metrics: tensors kept from a
      DataLoader's workers grow both shared and anonymous memory, and the census names one
      culprit for both).
    """
    out: list[Finding] = []
    best: dict[tuple[str, str], int] = {}
    for rule, f in found:
        if f.kind in rule.once:
            key = (f.metric, f.kind)
            if key in said:
                continue
            said.add(key)
        if f.culprit is not None:
            k = (f.kind, f.culprit)
            i = best.get(k)
            if i is not None:
                if (f.bytes_per_step or 0.0) > (out[i].bytes_per_step or 0.0):
                    out[i] = f
                continue
            best[k] = len(out)
        out.append(f)
    return out
