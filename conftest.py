"""Repository-wide pytest set-up shared by ``tests/``, ``integrations/`` and the doctests.

It lives at the repository root (not in ``tests/``) because a conftest only applies to the
directory it is in and below, and the docstring examples live in ``src/memwatch``. Nothing here
ships in the wheel.

Doctests are collected from ``src/memwatch`` only (not with ``--doctest-modules``, which would
import every helper module under ``tests/`` and ``integrations/`` as well, running whatever they
do at import time).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _pytest.doctest import DoctestItem, DoctestModule

PACKAGE = Path(__file__).resolve().parent / "src" / "memwatch"
BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"

# Modules that import an optional framework when imported (Lightning, transformers, wandb, ...):
# doctest collection imports every module, so a missing extra must not break `pytest`. Their
# examples are exercised by the real-framework suites in integrations/ instead.
collect_ignore_glob = [
    "src/memwatch/integrations/*",
    "src/memwatch/sinks/wandb*.py",
    "src/memwatch/testing/wandb_offline.py",
    "src/memwatch/sinks/prometheus*.py",
]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> DoctestModule | None:
    """Collect the docstring examples of memwatch's own modules."""
    if (file_path.suffix == ".py" and file_path.name != "__main__.py"
            and PACKAGE in file_path.resolve().parents):
        return DoctestModule.from_parent(parent, path=file_path)  # type: ignore[no-any-return]
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``gpu`` need a CUDA (or ROCm) device: without one they are skipped, saying
    so (``pytest -m gpu`` on a CPU machine, or ``make gpu-check``, which reports them)."""
    if item.get_closest_marker("gpu") is None:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            pytest.skip("needs torch with a CUDA or ROCm device (torch is not installed)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm device (run `pytest -m gpu` on a GPU machine)")


@pytest.fixture(autouse=True)
def _doctest_tmp(request: pytest.FixtureRequest, doctest_namespace: dict[str, Any]) -> None:
    """Docstring examples write under ``tmp`` (a per-example temporary directory, as a string)."""
    # Only doctest items pay for a temporary directory; unit tests ask for tmp_path themselves.
    if isinstance(request.node, DoctestItem):
        tmp: Path = request.getfixturevalue("tmp_path")
        doctest_namespace["tmp"] = str(tmp)


def _load_benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def benchmark_module() -> Callable[[str], ModuleType]:
    """Load ``benchmarks/<name>.py`` as a module (benchmarks are scripts, not a package)."""
    return _load_benchmark


@pytest.fixture
def quick_benchmark(tmp_path: Path) -> Callable[[str], tuple[Any, dict[str, Any]]]:
    """Run ``benchmarks/<name>.py --quick --out <tmp>``: (what main() returned, the JSON written).

    Benchmarks pin torch's thread count for steady timings; it is restored afterwards so the
    tests that follow run as configured.
    """

    def run(name: str) -> tuple[Any, dict[str, Any]]:
        bench = _load_benchmark(name)
        out = tmp_path / f"{name}.json"
        torch = sys.modules.get("torch")
        threads = torch.get_num_threads() if torch is not None else None
        try:
            res = bench.main(["--quick", "--out", str(out)])
        finally:
            torch = sys.modules.get("torch")
            if torch is not None and threads is not None:
                torch.set_num_threads(threads)
        return res, json.loads(out.read_text())

    return run


FRESH_CHILD = "MEMWATCH_TEST_FRESH_CHILD"
ROOT = Path(__file__).resolve().parent


def _zygote() -> ModuleType:
    """``tests/zygote.py``, loaded once per process (its zygote is this worker's)."""
    name = "zygote"  # (the name `import zygote` gives it from tests/: one module, one client)
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "zygote.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def run_fresh(kind: str, args: list[str], source: Path, cwd: Path, env: dict[str, str],
              out: Path, timeout: float) -> tuple[int, str]:
    """``pytest <args>`` (``kind="pytest"``) or ``python <args>`` (``"script"``) in a process
    no test ran in: forked from this worker's zygote (an interpreter that has only imported
    torch, the frameworks ``source`` names and memwatch: ``tests/zygote.py``), or a new
    interpreter where none can serve. The exit code and the output (stdout and stderr, as a
    terminal shows them)."""
    fresh = _zygote().fresh
    return fresh(kind, args, source=source, cwd=cwd, env=env, out=out,  # type: ignore[no-any-return]
                 timeout=timeout)


@pytest.fixture
def fresh_interpreter(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[int, str]]:
    """:func:`run_fresh`, its output kept in a temporary folder of its own (never the child's
    working directory, which may be the test's ``tmp_path``)."""
    where = tmp_path_factory.mktemp("fresh-output")
    n = iter(range(1_000_000))

    def run(kind: str, args: list[str], *, source: Path, cwd: Path, env: dict[str, str],
            timeout: float = 300) -> tuple[int, str]:
        return run_fresh(kind, args, source, cwd, env, where / f"{next(n)}.out", timeout)

    return run


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Tests marked ``fresh_process`` run in a pytest of their own, in a process no other test
    ran in (:func:`run_fresh`).

    They plant a host leak in a real framework run and assert what memwatch says of it, as a
    user's training process would see it. A process that already ran hundreds of tests keeps
    freed heap that the leak refills without RSS moving, so in the suite's process what the
    analyzer can say depended on the tests before. The child's failure is this test's failure,
    with its output."""
    import os
    import tempfile

    if pyfuncitem.get_closest_marker("fresh_process") is None or os.environ.get(FRESH_CHILD):
        return None
    with tempfile.TemporaryDirectory(prefix="memwatch-fresh-") as d:
        rc, out = run_fresh("pytest", ["-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                                       pyfuncitem.nodeid], Path(pyfuncitem.path), ROOT,
                            {**os.environ, FRESH_CHILD: "1"}, Path(d) / "out.txt", 1200)
    if rc != 0:
        pytest.fail(f"{pyfuncitem.nodeid} failed in a fresh process (exit {rc}):\n"
                    f"{out[-9000:]}", pytrace=False)
    return True
