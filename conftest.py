"""Repository-wide pytest set-up shared by ``tests/``, ``integrations/`` and the doctests.

It lives at the repository root (not in ``tests/``) because a conftest only applies to the
directory it is in and below, and the docstring examples live in ``src/memwatch``. Nothing here
ships in the wheel.

Doctests are collected from ``src/memwatch`` only (not with ``--doctest-modules``, which would
import every helper module under ``tests/`` and ``integrations/`` as well, running whatever they
do at import time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _pytest.doctest import DoctestItem, DoctestModule

PACKAGE = Path(__file__).resolve().parent / "src" / "memwatch"

# Modules that import an optional framework when imported (Lightning, transformers, wandb, ...):
# doctest collection imports every module, so a missing extra must not break `pytest`. Their
# examples are exercised by the real-framework suites in integrations/ instead.
collect_ignore_glob = [
    "src/memwatch/integrations/*",
    "src/memwatch/sinks/wandb*.py",
    "src/memwatch/sinks/prometheus*.py",
]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> DoctestModule | None:
    """Collect the docstring examples of memwatch's own modules."""
    if (file_path.suffix == ".py" and file_path.name != "__main__.py"
            and PACKAGE in file_path.resolve().parents):
        return DoctestModule.from_parent(parent, path=file_path)  # type: ignore[no-any-return]
    return None


@pytest.fixture(autouse=True)
def _doctest_tmp(request: pytest.FixtureRequest, doctest_namespace: dict[str, Any]) -> None:
    """Docstring examples write under ``tmp`` (a per-example temporary directory, as a string)."""
    # Only doctest items pay for a temporary directory; unit tests ask for tmp_path themselves.
    if isinstance(request.node, DoctestItem):
        tmp: Path = request.getfixturevalue("tmp_path")
        doctest_namespace["tmp"] = str(tmp)
