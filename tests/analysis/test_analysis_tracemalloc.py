"""``MemWatch(tracemalloc=...)``: a leak of plain Python objects named by the line that allocates.

The loops run in a child interpreter (this file is also the script: ``python
test_analysis_tracemalloc.py MODE OUT_JSON``): host RSS is the signal and other tests would
pollute it, and tracemalloc is process-wide state. The leaking line is in this file, so the
culprit must name this file and that line.

Modes: ``leak_on`` / ``leak_off`` (a module-level list gains a dict of 200 floats every step, with
and without tracemalloc), ``bytes_on`` / ``bytes_off`` (a list of 100 KB bytes objects),
``clean_on`` (no leak).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import memwatch
from memwatch.analysis.culprits.census import allocations, sites
from memwatch.core.errors import ConfigError

HERE = Path(__file__).resolve()
STEPS = 200  # per epoch
EPOCHS = 4  # the leak starts in epoch 1: verdict due at the end of epoch 3, plus one of margin

# --------------------------------------------------------------------------- the child's loop
history: list[dict[str, float]] = []
blobs: list[bytes] = []
PARAMS = [f"encoder.layers.{i // 8}.attention.block_{i % 8}.query_key_value.weight"
          for i in range(200)]


def _train(mode: str, out_path: str) -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(s: int) -> None:
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mode.startswith("leak"):
            # Per-parameter metrics kept for every step: 200 floats and their names (~40 KiB).
            history.append({f"grad/{p}": s / (i + 1) for i, p in enumerate(PARAMS)})  # <- the leak
        elif mode.startswith("bytes"):
            blobs.append(bytes(100_000))  # <- the bytes leak

    epochs: list[list[dict[str, Any]]] = []
    t0 = time.perf_counter()
    with memwatch.watch(device="cpu", workers=False, out_dir=tempfile.mkdtemp(),
                        tracemalloc=mode.endswith("_on")) as mw:
        s = 0
        for _ in range(EPOCHS):
            for _ in range(STEPS):
                train_step(s)
                s += 1
                mw.step()
            epochs.append([f.to_dict() for f in mw.end_epoch()])
        tracer = mw._checker.tracer
        last = tracer.last.summary() if tracer is not None and tracer.last else None
    result = {"epochs": epochs, "tracing_after_close": tracemalloc.is_tracing(),
              "disabled": mw.disabled, "last_diff": last,
              "seconds": time.perf_counter() - t0}
    with open(out_path, "w") as f:
        json.dump(result, f)


# --------------------------------------------------------------------------- helpers
_cache: dict[str, dict[str, Any]] = {}


def run_mode(mode: str, tmp_path: Path) -> dict[str, Any]:
    if mode not in _cache:  # each loop costs seconds: run it once per session
        out = tmp_path / f"{mode}.json"
        import zygote  # (tests/: this file is also the child's script, which has no zygote)

        env = dict(os.environ, PYTHONWARNINGS="error")
        zygote.script(HERE, [mode, str(out)], cwd=tmp_path, env=env, timeout=300)
        _cache[mode] = json.loads(out.read_text())
    return _cache[mode]


def line_of(marker: str) -> int:
    lines = HERE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(marker))


def host_findings(result: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for fs in result["epochs"] for f in fs
            if f["kind"] == kind and f["metric"] == "host.rss"]


# --------------------------------------------------------------------------- (1) leak named
def test_python_leak_is_named_by_its_allocation_site(tmp_path: Path) -> None:
    result = run_mode("leak_on", tmp_path)
    leaks = host_findings(result, "leak")
    assert leaks, result["epochs"]
    first = leaks[0]
    assert first["epoch"] <= EPOCHS - 1  # 0-based
    where = f"test_analysis_tracemalloc.py:{line_of('# <- the leak')} in _train.train_step"
    assert where in first["culprit"], first["culprit"]
    assert "allocated here, still alive" in first["culprit"]
    # The suggestion is about this container, not boilerplate.
    assert "`history` gains objects every step" in first["suggestions"][0], first["suggestions"]
    assert "deque(maxlen=N)" in first["suggestions"][0]
    assert "tracemalloc:" in first["message"] and "history.append(" in first["message"]
    ev = first["evidence"]
    top = ev["tracemalloc"][0]
    assert top["where"].endswith(f"test_analysis_tracemalloc.py:{line_of('# <- the leak')}")
    assert top["user_code"] is True and top["function"] == "_train.train_step"
    # 200 floats, 200 keys and a dict a step: about 400 new live blocks per step.
    assert 380 * STEPS <= top["count_delta"] <= 420 * STEPS, top
    assert top["bytes_per_step"] > 30_000, top
    assert top["traceback"][0] == top["where"]
    summary = ev["tracemalloc_summary"]
    assert summary["explains_growth"] is True and summary["steps"] == STEPS
    assert summary["frames"] == allocations.DEFAULT_FRAMES
    # Never called allocator retention while tracemalloc explains the growth.
    assert host_findings(result, "allocator_retention") == []
    assert result["tracing_after_close"] is False  # memwatch started it, memwatch stopped it
    assert result["disabled"] == {}


def test_bytes_cache_is_a_leak_not_allocator_retention(tmp_path: Path) -> None:
    """A few large objects per step: the census weighs them (it once counted 64 bytes each and
    called it allocator retention); tracemalloc adds where they were allocated: 100 KB of live
    bytes at one line each step."""
    off = run_mode("bytes_off", tmp_path)  # weighed by the census now (issue 16)
    assert host_findings(off, "allocator_retention") == [], off["epochs"]
    assert "blobs" in host_findings(off, "leak")[0]["culprit"], off["epochs"]

    on = run_mode("bytes_on", tmp_path)
    leaks = host_findings(on, "leak")
    assert leaks, on["epochs"]
    assert host_findings(on, "allocator_retention") == []
    culprit = leaks[0]["culprit"]
    assert f"test_analysis_tracemalloc.py:{line_of('# <- the bytes leak')}" in culprit, culprit
    top = leaks[0]["evidence"]["tracemalloc"][0]
    assert top["count_delta"] == STEPS and top["bytes_delta"] >= 100_000 * STEPS, top
    assert "`blobs` gains objects every step" in leaks[0]["suggestions"][0]


# --------------------------------------------------------------------------- (2) off: as before
def test_python_leak_without_tracemalloc_is_weighed(tmp_path: Path) -> None:
    """Without tracemalloc the census sees the list of dicts of floats grow and weighs its new
    elements (issue 16): a leak named at its holder, in bytes. Before, dicts of floats were
    counted at 64 bytes each and the growth read as allocator retention."""
    result = run_mode("leak_off", tmp_path)
    assert host_findings(result, "allocator_retention") == [], result["epochs"]
    leaks = host_findings(result, "leak")
    assert leaks, result["epochs"]
    assert leaks[0]["epoch"] <= EPOCHS - 1
    assert "test_analysis_tracemalloc.history (list," in leaks[0]["culprit"], leaks[0]
    assert "dicts" in leaks[0]["culprit"]
    assert "tracemalloc" not in leaks[0]["evidence"]
    assert result["last_diff"] is None and result["tracing_after_close"] is False


# --------------------------------------------------------------------------- (3) clean loop
def test_clean_loop_with_tracemalloc_is_quiet(tmp_path: Path) -> None:
    result = run_mode("clean_on", tmp_path)
    assert [f for fs in result["epochs"] for f in fs if f["severity"] != "info"] == []
    assert host_findings(result, "leak") == []
    last = result["last_diff"]
    # the last diff spans the last epoch: between the last two checks (keyed by check number:
    # checks sized to the run add early ones inside epoch 0), STEPS steps apart
    assert last is not None and last["steps"] == STEPS, last
    assert last["epochs"][1] == last["epochs"][0] + 1, last
    # Nothing of the loop's own grows: a few KiB of interpreter caches at most.
    assert last["traced_net_bytes"] < 256 * 1024, last
    assert result["tracing_after_close"] is False and result["disabled"] == {}


# --------------------------------------------------------------------------- (4) ownership
def _steps(mw: memwatch.MemWatch, n: int, keep: list[Any] | None = None) -> None:
    for i in range(n):
        if keep is not None:
            keep.append(bytes(20_000 + i))
        mw.step()


def test_users_tracing_is_used_and_kept_running(tmp_path: Path) -> None:
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start(3)
    try:
        limit = tracemalloc.get_traceback_limit()
        keep: list[Any] = []
        with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path),
                            tracemalloc=16) as mw:
            _steps(mw, 20)
            mw.end_epoch()
            _steps(mw, 20, keep)
            mw.end_epoch()
            tracer = mw._checker.tracer
            assert tracer.was_tracing and tracer.limit == limit
            diff = tracer.last
            assert diff is not None and diff.frames == limit
            # (With the user's 3 frames, an import deep in a library cannot be told from other
            # allocations: find this file's site rather than assume it is the largest.)
            mine = [g for g in diff.growths if g.file == str(HERE)]
            assert mine and mine[0].count_delta >= 20, diff.growths
            assert mine[0].bytes_delta >= 20 * 20_000
        assert tracemalloc.is_tracing(), "memwatch stopped tracing the user had started"
        assert tracemalloc.get_traceback_limit() == limit
        assert mw.disabled == {}
    finally:
        if not was:
            tracemalloc.stop()


def test_memwatch_tracing_stops_with_the_last_session(tmp_path: Path) -> None:
    if tracemalloc.is_tracing():
        pytest.skip("the interpreter traces already (python -X tracemalloc)")
    a = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp_path / "a"),
                          tracemalloc=True).start()
    assert tracemalloc.is_tracing()
    assert tracemalloc.get_traceback_limit() == allocations.DEFAULT_FRAMES
    b = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp_path / "b"),
                          tracemalloc=2).start()
    assert b._checker.tracer.limit == allocations.DEFAULT_FRAMES  # what runs, not what b asked for
    a.close()
    assert tracemalloc.is_tracing(), "the first close stopped tracing the second still uses"
    _steps(b, 10)
    b.end_epoch()
    assert b.disabled == {}
    b.close()
    assert not tracemalloc.is_tracing()
    b.close()  # idempotent


def test_analyze_false_does_not_trace(tmp_path: Path) -> None:
    if tracemalloc.is_tracing():
        pytest.skip("the interpreter traces already (python -X tracemalloc)")
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path), analyze=False,
                        tracemalloc=True) as mw:
        assert not tracemalloc.is_tracing() and mw._checker.tracer is None


def test_tracing_stopped_under_memwatch_disables_the_feature_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    if tracemalloc.is_tracing():
        pytest.skip("the interpreter traces already (python -X tracemalloc)")
    caplog.set_level(logging.WARNING, logger="memwatch")
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path),
                        tracemalloc=True) as mw:
        _steps(mw, 10)
        mw.end_epoch()
        tracemalloc.stop()  # someone else stops it mid-run
        _steps(mw, 10)
        mw.end_epoch()  # does not raise
        assert "tracemalloc" in mw.disabled and mw._checker.tracer is None
        assert "analyzer" not in mw.disabled
        _steps(mw, 10)
        assert mw.step_count == 30
    assert any("tracemalloc disabled" in r.getMessage() for r in caplog.records)
    assert not tracemalloc.is_tracing()


def test_forked_child_stops_tracing_memwatch_started(
    run_python: Any,
) -> None:
    proc = run_python(
        """
        import os, tempfile, tracemalloc
        import memwatch

        mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=tempfile.mkdtemp(),
                               tracemalloc=True).start()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"1" if tracemalloc.is_tracing() else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        print("child", os.read(r, 1).decode(), "parent", int(tracemalloc.is_tracing()))
        mw.close()
        """
    )
    assert proc.stdout.split() == ["child", "0", "parent", "1"], proc.stdout


# --------------------------------------------------------------------------- (5) bad values
@pytest.mark.parametrize("value", ["yes", 0, -1, allocations.MAX_FRAMES + 1, 2.5, None])
def test_bad_tracemalloc_values_raise_config_error(value: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tracemalloc=.*use False \(off\), True"):
        memwatch.MemWatch(device="cpu", out_dir=str(tmp_path), tracemalloc=value)


def test_good_tracemalloc_values(tmp_path: Path) -> None:
    def frames(v: Any) -> int:
        return memwatch.MemWatch(device="cpu", out_dir=str(tmp_path),
                                 tracemalloc=v).tracemalloc_frames

    assert frames(False) == 0 and frames(True) == allocations.DEFAULT_FRAMES
    assert frames(1) == 1 and frames(allocations.MAX_FRAMES) == allocations.MAX_FRAMES


def test_integrations_check_the_option_at_construction() -> None:
    from memwatch.integrations._driver import Driver

    Driver("MemWatchCallback", None, {"tracemalloc": 4})
    with pytest.raises(ConfigError, match="tracemalloc='on'"):
        Driver("MemWatchCallback", None, {"tracemalloc": "on"})


# --------------------------------------------------------------------------- the pieces
def test_grouping_matches_tracemalloc_statistics() -> None:
    """The allocation-free grouping gives what ``Snapshot.statistics`` gives."""
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start(4)
    try:
        keep = [[float(i)] * (i % 7 + 1) for i in range(3000)]
        snap = tracemalloc.take_snapshot()
    finally:
        if not was:
            tracemalloc.stop()
    for key in ("traceback", "lineno"):
        ours = {frames: (size, count) for frames, size, count in
                sites.group_traces(snap, key)}
        theirs = {tuple((f.filename, f.lineno) for f in reversed(st.traceback)):
                  (st.size, st.count) for st in snap.statistics(key)}
        assert ours == theirs
    assert len(keep) == 3000


@pytest.mark.parametrize(("code", "expected"), [
    ("self.history.append({'a': 1.0})", "`history` gains objects every step"),
    ("cache[key] = np.zeros(1000)", "`cache` is a cache without eviction"),
    ("seen.setdefault(k, []).append(v)", "`seen` is a cache without eviction"),
    ("log += f'step {s}: {loss:.3f}\\n'", "`log` grows by concatenation"),
    ("x = make_thing()", "Objects allocated at train.py:7 stay alive"),
])
def test_suggestions_follow_the_line(code: str, expected: str) -> None:
    from memwatch.analysis.culprits.wording import site_suggestions

    site = sites.SiteGrowth(file="/x/train.py", line=7, user=True, bytes_delta=1,
                                  count_delta=1, size=1, count=1, traceback=(), code=code,
                                  where="train.py:7")
    assert expected in site_suggestions(site)[0]


def test_paths_and_functions() -> None:
    assert sites.is_user_file(str(HERE))
    assert not sites.is_user_file(json.__file__)
    assert not sites.is_user_file(allocations.__file__)  # memwatch's own
    assert sites.short_path(str(HERE), str(HERE.parent)) == HERE.name
    assert sites.short_path(json.__file__, "/nowhere") == "json/__init__.py"
    assert sites.function_at(str(HERE), line_of("# <- the leak")) == "_train.train_step"
    assert sites.function_at(str(HERE), 1) == "<module>"


# --------------------------------------------------------------------------- the cost benchmark
def test_cost_benchmark_quick(quick_benchmark: Any) -> None:
    if tracemalloc.is_tracing():
        pytest.skip("the interpreter traces already (python -X tracemalloc)")
    res, on_disk = quick_benchmark("bench_tracemalloc_cost")
    assert on_disk == json.loads(json.dumps(res))
    variants = on_disk["loop"]["variants"]
    assert list(variants) == ["off", "frames=1", "frames=8 (True)", "frames=16"]
    off, on = variants["off"], variants["frames=8 (True)"]
    assert off["ratio_to_off"] == 1.0 and off["snapshot_diff_ms"] is None
    assert 0 < off["median_step_ms"] < on["median_step_ms"]  # tracing costs (about 4x here)
    assert on["snapshot_diff_ms"] > 0 and on["tracemalloc_memory_bytes"] > 0
    assert all(v["disabled"] == [] for v in variants.values())
    per = on_disk["per_allocation_ns"]
    assert per["off"] < per["frames=1"] < per["frames=16"]
    snap = on_disk["snapshot"][0]
    assert snap["live_traces"] >= 20_000 and snap["groups_line"] <= snap["groups_traceback"]
    assert not tracemalloc.is_tracing()  # every variant stopped what it started


if __name__ == "__main__":  # the child's loop; never at import (pytest collects this file)
    _train(sys.argv[1], sys.argv[2])
