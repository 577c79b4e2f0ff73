"""The shape every rule has, what it is handed, and the one de-duplication policy.

A rule is a :class:`Rule` value: a name, the finding kinds it may return, which of them are said
once per run, and a ``judge`` function of one input (a :class:`RuleInput` at every check; the
cross-rank rule judges the ranks' summaries instead). The input is everything a verdict may use:
this check's summary and statistics, the units judged per metric, the check's context and
tuning, and the :class:`~memwatch.analysis.evidence.Evidence` port (the only way a rule learns
anything about the live process). A rule never walks the heap or reads ``/proc`` itself
(``tests/test_architecture.py`` checks its imports), so it can be tested from recorded values.

A rule that delegates some of its verdicts to modules of its own lists them as its ``parts``
(:class:`SubRule`): the leak rule's mapped-file and native-memory verdicts. Every finding names
the rule or part that made it (``Finding.rule``): rules make findings through
``origin.finding(rule=NAME, ...)``.

Example (a rule is a value; :data:`memwatch.analysis.rules.RULES` lists the ones that run)::

    >>> from memwatch.analysis.rules import RULES
    >>> " ".join(r.name for r in RULES)
    'leak worker_count workers copy_on_write fragmentation outside_allocator near_oom'
    >>> sorted(RULES[0].kinds)[:3]
    ['accumulation', 'allocator_retention', 'leak']
    >>> [p.name for p in RULES[0].parts]
    ['mapped_file', 'native', 'bounded', 'belief']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from memwatch.analysis.context import AnalyzerConfig, CheckContext
from memwatch.analysis.evidence import Attribution, CensusPair, Evidence
from memwatch.analysis.stats.forecast import consequence
from memwatch.analysis.stats.shapes import EpochStats
from memwatch.core.findings import Finding, Severity
from memwatch.timeline import EpochSummary

__all__ = ["Rule", "RuleInput", "SubRule", "dedupe"]

In = TypeVar("In")


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

    def severity(self, steps_to_oom: float | None, cur: EpochStats) -> Severity:
        """Severity by consequence (:func:`memwatch.analysis.stats.forecast.consequence`) of a
        growth that reaches its limit in ``steps_to_oom`` steps, judged on ``cur``."""
        return consequence(steps_to_oom, cur, self.ctx.remaining(cur), self.cfg.critical_checks)

    def traced_explains(self, metric: str) -> bool:
        """This check's live traced Python allocations (``tracemalloc=``) grew by a fair share
        of ``metric``'s growth: user code keeps them. False without tracing, and for metrics
        tracemalloc does not see (it sees the host only)."""
        trace = self.ctx.trace if metric.startswith("host.") else None
        return trace is not None and bool(trace.explains(self.cfg.shape.min_growth_bytes,
                                                         self.cfg.retention_explained))


@dataclasses.dataclass(frozen=True)
class SubRule:
    """A verdict a rule delegates to a module of its own and runs itself: listed in the
    parent's :attr:`Rule.parts`, its findings name it (``Finding.rule``) and are said through
    the parent (its ``once``, its place in the order).

    Attributes:
        name: how findings, docs and tests name it.
        kinds: the finding kinds it may make (among its parent's).
    """

    name: str
    kinds: frozenset[str]


@dataclasses.dataclass(frozen=True)
class Rule(Generic[In]):
    """One rule of the analyzer.

    Attributes:
        name: how findings (``Finding.rule``), docs, tests and logs name it.
        kinds: the finding kinds it may return (each in :data:`memwatch.core.findings.KINDS`),
            its parts' included.
        once: of those kinds, the ones said once per (metric, kind) for the whole run: a
            benign shape (a plateau, accumulation) is news once; a leak's figures (rate,
            forecast, culprit) are news at every check.
        judge: the verdicts of one check.
        reads: the metrics it judges (documentation; the analyzer hands it all).
        parts: the verdicts it delegates to modules of its own (:class:`SubRule`).
    """

    name: str
    kinds: frozenset[str]
    once: frozenset[str]
    judge: Callable[[In], list[Finding]]
    reads: tuple[str, ...] = ()
    parts: tuple[SubRule, ...] = ()

    def __post_init__(self) -> None:
        if not self.once <= self.kinds:
            raise ValueError(f"rule {self.name}: once={sorted(self.once)} must be among its "
                             f"kinds {sorted(self.kinds)}")
        for p in self.parts:
            if not p.kinds <= self.kinds:
                raise ValueError(f"rule {self.name}: its part {p.name} makes kinds "
                                 f"{sorted(p.kinds - self.kinds)} it does not declare")

    @property
    def names(self) -> frozenset[str]:
        """The names its findings may carry: its own and its parts'."""
        return frozenset({self.name, *(p.name for p in self.parts)})


def dedupe(found: Iterable[tuple[Rule[Any], Finding]],
           said: set[tuple[str, ...]]) -> list[Finding]:
    """The one policy for findings said twice.

    * Across checks: a finding of a kind its rule says once is dropped when (metric, kind,
      holder) was said before (``said`` is updated): a holder filling its own bound is other
      news than a warm-up that levelled off.
    * Within one check: of findings with the same kind and culprit, only the one with the
      largest rate is kept (the same growth seen through two metrics: tensors kept from a
      DataLoader's workers grow both shared and anonymous memory, and the census names one
      culprit for both).
    """
    out: list[Finding] = []
    best: dict[tuple[str, str], int] = {}
    for rule, f in found:
        if f.kind in rule.once:
            key = (f.metric, f.kind, str(f.evidence.get("holder") or ""))
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
