"""Fixtures of the analyzer's tests: every check these tests run holds the verdict contract's
bookkeeping, each finding named by the rule (or part) that made it, of a kind that rule
declares."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from rule_checks import check_named

from memwatch.analysis import analyzer as analyzer_mod
from memwatch.analysis.rules import Rule
from memwatch.core.findings import Finding


@pytest.fixture(autouse=True)
def _findings_name_their_rule(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = analyzer_mod.dedupe

    def checked(found: Iterable[tuple[Rule[Any], Finding]],
                said: set[tuple[str, str]]) -> list[Finding]:
        return real(check_named(found), said)

    monkeypatch.setattr(analyzer_mod, "dedupe", checked)
    yield
