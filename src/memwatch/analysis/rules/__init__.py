"""The analyzer's rules, one module (or one package, with its parts) each, and the registry.

:data:`RULES` is what every check runs, in order; :data:`ACROSS_RANKS` is rank 0's rule over the
summaries of a distributed job's ranks, run after the check's exchange. Each rule is a
:class:`~memwatch.analysis.rules.base.Rule` (``RULE`` in its module): its name, the finding
kinds it may return, which of them are said once per run, its ``judge`` function, and the
wording of its messages beside it. A rule that makes some verdicts through modules of its own
lists them as its ``parts`` (the leak rule's :mod:`.leak.mapped_file` and :mod:`.leak.native`).
Every finding names the rule or part that made it (``Finding.rule``).

A rule imports only the shared base (:mod:`.base`), the shared wording (:mod:`.words`, and the
culprit's in :mod:`memwatch.analysis.culprits.wording`), the statistics of
:mod:`memwatch.analysis.stats`, the port's values and its own parts: never another rule
(``tests/test_architecture.py`` checks it), so each reads on its own.

Adding a rule: a module here defining ``NAME`` and ``RULE``, one line in :data:`RULES`, its kind
in :data:`memwatch.core.findings.KINDS` if new, and its tests in ``tests/analysis/`` (a rule is
a function of a :class:`~memwatch.analysis.rules.base.RuleInput`: build one from recorded
summaries, see ``docs/architecture.md``).
"""

from __future__ import annotations

from typing import Any

from memwatch.analysis.rules import (
    copy_on_write,
    fragmentation,
    leak,
    near_oom,
    outside_allocator,
    ranks,
    worker_count,
    workers,
)
from memwatch.analysis.rules.base import Rule, RuleInput, SubRule, dedupe
from memwatch.analysis.rules.ranks import RankInput

__all__ = ["ACROSS_RANKS", "RULES", "RankInput", "Rule", "RuleInput", "SubRule", "dedupe",
           "registered"]

#: The rules every check runs, in this order (findings are reported in this order too).
RULES: tuple[Rule[RuleInput], ...] = (
    leak.RULE,
    worker_count.RULE,
    workers.RULE,
    copy_on_write.RULE,
    fragmentation.RULE,
    outside_allocator.RULE,
    near_oom.RULE,
)

#: Rank 0's rule across the ranks of a distributed job, after each check's exchange.
ACROSS_RANKS: Rule[RankInput] = ranks.RULE


def registered() -> dict[str, Rule[Any] | SubRule]:
    """Every rule and part by the name its findings carry (``Finding.rule``)."""
    out: dict[str, Rule[Any] | SubRule] = {}
    every: tuple[Rule[Any], ...] = (*RULES, ACROSS_RANKS)
    for rule in every:
        out[rule.name] = rule
        out.update((p.name, p) for p in rule.parts)
    return out
