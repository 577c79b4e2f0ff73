"""Fixtures shared by the unit tests in ``tests/``.

The doctest ``tmp`` name lives in the repository's root ``conftest.py`` (it must also reach
``src/memwatch``). Here: helpers for tests that need process isolation, such as running
``import memwatch`` with torch made unimportable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# Prepended to a child interpreter's code: a meta-path finder that refuses torch, as if it were
# not installed. Installed before anything else runs, so nothing can have imported torch yet.
_BLOCK_TORCH = textwrap.dedent(
    """
    import sys

    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, _NoTorch())
    """
)

RunPython = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_python() -> RunPython:
    """Run Python code in a fresh interpreter; ``block_torch=True`` makes torch unimportable.

    Returns the completed process (stdout/stderr as text); a non-zero exit fails the test with
    the child's stderr, so assertion messages from the child are visible.
    """

    def run(code: str, *, block_torch: bool = False, timeout: float = 120) -> (
        subprocess.CompletedProcess[str]
    ):
        src = (_BLOCK_TORCH if block_torch else "") + textwrap.dedent(code)
        env = dict(os.environ, PYTHONWARNINGS="error")
        proc = subprocess.run(
            [sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout, env=env
        )
        if proc.returncode != 0:
            pytest.fail(f"child exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    return run


@pytest.fixture(scope="session")
def other_user() -> Iterator[Any]:
    """A real second local user (created with ``useradd``, removed afterwards) for the
    shared-machine tests; skips where the tests do not run as root."""
    from second_user import create_user, delete_user

    user = create_user(f"mwtest{os.getpid() % 100000}")
    if isinstance(user, str):
        pytest.skip(user)
    try:
        yield user
    finally:
        delete_user(user)
