"""The rule registry: every verdict maker is a registered rule (or a part listed under one),
every finding kind has a rule that makes it, and every finding names the rule that made it."""

from __future__ import annotations

from typing import Any

import pytest
from rule_checks import check_named

from memwatch.analysis.rules import ACROSS_RANKS, RULES, Rule, RuleInput, SubRule, registered
from memwatch.analysis.rules.ranks import cross_rank_findings
from memwatch.core.findings import KINDS, Origin


def test_every_kind_has_a_rule_and_every_rule_declares_known_kinds() -> None:
    makers = registered()
    declared = {k for m in makers.values() for k in m.kinds}
    assert declared == set(KINDS)
    assert len(makers) == len({*(r.name for r in (*RULES, ACROSS_RANKS)),
                               *(p.name for r in RULES for p in r.parts)})  # names unique


def test_parts_are_listed_under_the_rule_that_runs_them() -> None:
    (leak,) = [r for r in RULES if r.name == "leak"]
    assert [p.name for p in leak.parts] == ["mapped_file", "native", "bounded", "belief"]
    with pytest.raises(ValueError, match="part stray makes kinds"):
        Rule(name="x", kinds=frozenset({"leak"}), once=frozenset(), judge=lambda inp: [],
             parts=(SubRule("stray", frozenset({"plateau"})),))


def test_a_finding_of_another_rule_is_caught() -> None:
    """The check every analyzer test runs (conftest): planted, it fails."""
    rule: Rule[RuleInput] = RULES[-1]  # near_oom
    wrong = Origin().finding(rule="leak", kind="leak", metric="host.rss", severity="info",
                             message="...")
    with pytest.raises(AssertionError, match="near_oom returned a finding of rule 'leak'"):
        check_named([(rule, wrong)])
    odd = Origin().finding(rule="near_oom", kind="plateau", metric="host.rss",
                           severity="info", message="...")
    with pytest.raises(AssertionError, match="near_oom made a 'plateau'"):
        check_named([(rule, odd)])


def test_cross_rank_findings_name_their_rule() -> None:
    summaries: list[dict[str, Any] | None] = [None, None]
    found = cross_rank_findings(summaries, [1], 60.0)
    assert found and {f.rule for f in found} == {ACROSS_RANKS.name}
    assert {f.kind for f in found} <= ACROSS_RANKS.kinds
