"""Repository-wide pytest set-up shared by ``tests/``, ``integrations/`` and the doctests.

It lives at the repository root (not in ``tests/``) because a conftest only applies to the
directory it is in and below, and the docstring examples collected by ``--doctest-modules`` live in
``src/memwatch``. Nothing here ships in the wheel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _pytest.doctest import DoctestItem

# Modules that import an optional framework when imported (Lightning, transformers, wandb, ...):
# doctest collection imports every module, so a missing extra must not break `pytest`. Their
# examples are exercised by the real-framework suites in integrations/ instead.
collect_ignore_glob = [
    "src/memwatch/integrations/*",
    "src/memwatch/sinks/wandb*.py",
    "src/memwatch/sinks/prometheus*.py",
]


@pytest.fixture(autouse=True)
def _doctest_tmp(request: pytest.FixtureRequest, doctest_namespace: dict[str, Any]) -> None:
    """Docstring examples write under ``tmp`` (a per-example temporary directory, as a string)."""
    # Only doctest items pay for a temporary directory; unit tests ask for tmp_path themselves.
    if isinstance(request.node, DoctestItem):
        tmp: Path = request.getfixturevalue("tmp_path")
        doctest_namespace["tmp"] = str(tmp)
