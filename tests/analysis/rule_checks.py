"""What every analyzer test checks of each check's findings (``conftest.py`` runs it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memwatch.analysis.rules import Rule, SubRule
from memwatch.core.findings import Finding


def check_named(found: Iterable[tuple[Rule[Any], Finding]]) -> list[tuple[Rule[Any], Finding]]:
    """``found`` as it is, after asserting that each finding names the rule that returned it
    (or one of its parts) and is of a kind that rule or part declares."""
    out = list(found)
    for rule, f in out:
        assert f.rule in rule.names, f"{rule.name} returned a finding of rule {f.rule!r}"
        maker: Rule[Any] | SubRule = next((p for p in rule.parts if p.name == f.rule), rule)
        assert f.kind in maker.kinds, f"{f.rule} made a {f.kind!r} it does not declare"
    return out
