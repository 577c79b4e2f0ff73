"""The foundation benchmarks run (in reduced modes) and produce sane figures and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_bench_hotpath_quick(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "hotpath.json"
    proc = _run("bench_hotpath.py", "--quick", "--workers", "2", "--json", str(out))
    data = json.loads(out.read_text())
    rows = {r["case"].split()[0]: r for r in data["rows"]}
    assert set(rows) == {"floor:", "(a)", "(b)", "(c)"}
    for key, r in rows.items():
        # Sanity, not the targets: this box may be loaded by other jobs.
        assert 0 < r["median_us"] < 200, (key, r)
        assert r["p99_us"] >= r["median_us"]
    assert rows["(c)"]["workers_seen"] == 2
    assert rows["(a)"]["verdict"] in ("PASS", "MISS") and rows["floor:"]["verdict"] is None
    assert "median us" in proc.stdout and "PASS" in proc.stdout + "MISS"


def test_bench_own_memory_short(tmp_path: Path) -> None:
    out = tmp_path / "own.json"
    proc = _run("bench_own_memory.py", "--steps", "4000", "--epoch-every", "500", "--no-analyze",
                "--json", str(out))
    data = json.loads(out.read_text())
    assert [m["at"] for m in data["marks"]] == ["50%", "75%", "100%"]
    assert [m["epochs_kept"] for m in data["marks"]] == [4, 6, 8]
    assert 1 << 20 < data["peak_bytes"] < 16 << 20  # the ring alone is a few MiB
    assert data["verdict_limit"] == "PASS"
    assert "peak held by memwatch" in proc.stdout


def test_run_all_continues_past_failures_and_reports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    benchmark_module: Callable[[str], ModuleType],
) -> None:
    run_all = benchmark_module("run_all")
    (tmp_path / "bench_a_fails.py").write_text("import sys; print('A ran'); sys.exit(3)\n")
    (tmp_path / "bench_b_works.py").write_text("print('B ran')\n")
    (tmp_path / "not_a_bench.py").write_text("raise SystemExit('must not run')\n")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    assert run_all.main([]) == 1
    out = capfd.readouterr().out
    assert "A ran" in out and "B ran" in out and "must not run" not in out
    assert "FAILED (exit 3)" in out
    assert run_all.main(["b_works"]) == 0
    assert run_all.main(["nothing-matches"]) == 2


def test_bench_run_overhead_quick(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = _run("bench_run_overhead.py", "--quick", "--out", str(out))
    data = json.loads(out.read_text())
    t = data["trivial"]
    assert t["pairs"] == 2 and len(t["pairs_s"]) == 2
    # Sanity, not a target: the watched start imports memwatch, the bare one nothing.
    assert 0 < t["bare_median_s"] < t["watched_median_s"] < 60
    assert "torch" not in data and "steps" not in data  # --quick: the trivial case only
    assert "start-up: print('hello')" in proc.stdout
