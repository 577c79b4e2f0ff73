"""The analyzer's rules, one module each, and the ordered registry :data:`RULES` it runs.

Each module defines one :class:`~memwatch.analysis.rules.base.Rule` (``RULE``): its name, the
finding kinds it may return, which of them are said once per run, its ``judge(inp)`` function,
and the wording of its messages beside it. Shared pieces: the statistics in
:mod:`memwatch.analysis.stats` (trend, shape and noise floor, held growth, forecast), the
wording of metrics and forecasts in :mod:`.words`, the culprit's wording in
:mod:`memwatch.analysis.culprits.wording`, and the one de-duplication policy
(:func:`~memwatch.analysis.rules.base.dedupe`) the analyzer applies to every rule's findings.

Adding a rule: a module here defining ``RULE``, one line in :data:`RULES`, its kind in
:data:`memwatch.core.findings.KINDS` if new, and its tests in ``tests/analysis/`` (a rule is
a function of a :class:`~memwatch.analysis.rules.base.RuleInput`: build one from recorded
summaries, see ``docs/architecture.md``).

Sub-rules run inside the rule whose verdict they refine: :mod:`.mapped_file` inside
:mod:`.leak` (RSS that is mostly pages of mapped files), :mod:`.worker_count` inside
:mod:`.workers` (workers that multiply). :mod:`.ranks` is rank 0's rule across the ranks of a
distributed job, run after the check's exchange rather than on one process's summaries.
"""

from __future__ import annotations

from memwatch.analysis.rules import (
    copy_on_write,
    fragmentation,
    leak,
    near_oom,
    outside_allocator,
    workers,
)
from memwatch.analysis.rules.base import Rule, RuleInput, dedupe

__all__ = ["RULES", "Rule", "RuleInput", "dedupe"]

#: The rules every check runs, in this order (findings are reported in this order too).
RULES: tuple[Rule, ...] = (
    leak.RULE,
    workers.RULE,
    copy_on_write.RULE,
    fragmentation.RULE,
    outside_allocator.RULE,
    near_oom.RULE,
)
