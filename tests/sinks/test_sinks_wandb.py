"""WandbSink against real offline W&B runs, read back from the run directory.

Each test makes a real ``wandb.init`` in offline mode under ``tmp_path`` and decodes the run's
``.wandb`` transaction log and media files with :mod:`memwatch.testing.wandb_offline`.
"""

from __future__ import annotations

import doctest
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memwatch
from memwatch.sinks.wandb import WandbSink, find_run
from memwatch.testing.wandb_offline import OfflineRun, read_offline_run
from sinks_helpers import GIB, leak_run

wandb = pytest.importorskip("wandb")


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    yield
    if wandb.run is not None:
        wandb.finish()


def finish(run: Any) -> OfflineRun:
    run_dir = Path(run.dir).parent
    run.finish()
    return read_offline_run(run_dir)


def chart_lines(data: OfflineRun, key: str) -> dict[str, list[tuple[float, float]]]:
    """The series of a line_series chart under ``key`` (its table: step, lineKey, lineVal)."""
    tables = data.tables(f"{key}_table")
    assert tables, [k for r in data.history for k in r]
    out: dict[str, list[tuple[float, float]]] = {}
    for x, name, y in tables[-1]["data"]:
        out.setdefault(name, []).append((x, y))
    return out


def test_leak_run_panels_summary_and_oom_artifact(tmp_path: Path) -> None:
    run = wandb.init(project="memwatch-test")
    sink = WandbSink()
    leak_run(tmp_path, [sink], epochs=3, steps=100, every=25, oom=True,
             after_step=lambda s: run.log({"loss": 1.0 / s}))  # the trainer's own rows
    assert sink.found_via == "wandb.run"
    data = finish(run)

    # Per-step series at the expected steps, keyed to memwatch/step with max summaries, on the
    # trainer's rows: memwatch adds no row of its own.
    series = data.series("memwatch/device.allocated_gib")
    assert [s for s, _ in series] == list(range(25, 301, 25))
    assert len(data.history) == 300 and all("loss" in r for r in data.history)
    assert series[-1][1] == pytest.approx((GIB + 299 * 2 * 2**20) / GIB, abs=1e-3)
    defs = {m["name"]: m for m in data.metrics}
    assert defs["memwatch/step"]["hidden"]
    assert defs["memwatch/device.allocated_gib"]["step_metric"] == "memwatch/step"
    assert defs["memwatch/device.allocated_gib"]["summary"] == ["max"]
    assert defs["memwatch/findings/leak.device.allocated_steps_to_oom"]["summary"] == ["min"]

    # One findings table, in the summary: one row per belief (its current state and history),
    # the planted leak's among them; written when a verdict changed, not at every check (each
    # write is a version of its artifact).
    table = data.summary_table("memwatch/findings_table")
    assert table is not None and not data.tables("memwatch/findings_table")
    cols = table["columns"]
    assert cols == ["step", "stage", "kind", "metric", "severity", "mib_per_step",
                    "steps_to_oom", "culprit", "message", "state", "history"]
    rows = [dict(zip(cols, r, strict=True)) for r in table["data"]]
    leak = [r for r in rows if r["kind"] == "leak" and r["metric"] == "device.allocated"]
    assert len(leak) == 1 and leak[0]["mib_per_step"] == pytest.approx(2.0, rel=0.05)
    assert leak[0]["steps_to_oom"] > 0 and "per step" in leak[0]["message"]
    versions = [a for a in data.artifacts if "findings_table" in a["name"]]
    assert 1 <= len(versions) <= 3, versions

    # The leak chart: floors, fitted trend, forecast up to the 8 GiB limit (drawn at the check
    # of step 200, which the next sample's row took along; the last check's, at the run's end,
    # had no row to ride on).
    lines = chart_lines(data, "memwatch/leak/device.allocated")
    assert set(lines) == {"floor at each check", "fitted trend", "forecast", "limit"}
    assert [x for x, _ in lines["floor at each check"]] == [100, 200]
    assert lines["forecast"][-1][1] == pytest.approx(8.0) and lines["limit"][0][1] == 8.0
    floors = [y for _, y in lines["floor at each check"]]
    assert floors == sorted(floors)

    # Summary fields: plain values.
    summ = data.summary
    assert summ["memwatch/verdict"] == "warning: leak in device.allocated"
    assert summ["memwatch/findings"] == len(rows)
    assert isinstance(summ["memwatch/findings/count"], (int, float))  # a number, not {"last"}
    assert summ["memwatch/worst_steps_to_oom"] > 0
    assert summ["memwatch/peak/device.allocated_gib"] == pytest.approx(1.584, abs=0.01)
    assert "device.allocated" in summ["memwatch/worst_forecast"]

    # The OOM bundle as an artifact, with metadata, and its report in the run's media.
    oom = [a for a in data.artifacts if a["type"] == "memwatch-oom"]
    assert len(oom) == 1, data.artifacts
    meta = oom[0]["metadata"]
    assert meta["trigger"] == "exception" and meta["classification"] == "cuda_oom"
    assert meta["rank"] == 0 and meta["peak_bytes"]["device.allocated"] > GIB
    assert {"manifest.json", "report.html", "memory.json", "exception.json"} <= set(
        oom[0]["files"])
    assert list(data.path.glob("files/media/html/memwatch/report_*.html"))
    assert summ["memwatch/oom"] == 1  # (at the run's end: no row took it along)
    assert summ["memwatch/bundle"].endswith("(memwatch-oom)")
    assert not data.alerts  # offline: nobody to alert
    assert not [a for a in data.artifacts if a["type"] == "memory-snapshot"]


def test_end_of_run_snapshot_after_findings(tmp_path: Path) -> None:
    run = wandb.init(project="memwatch-test")
    sink = WandbSink()
    leak_run(tmp_path, [sink], epochs=3, steps=60, every=20)
    data = finish(run)
    snap = [a for a in data.artifacts if a["type"] == "memory-snapshot"]
    assert len(snap) == 1, data.artifacts
    assert snap[0]["metadata"]["trigger"] == "end_of_run" and "report.html" in snap[0]["files"]
    assert list(data.path.glob("files/media/html/memwatch/report_*.html"))


def test_clean_run_has_series_and_an_ok_verdict_only(tmp_path: Path) -> None:
    run = wandb.init(project="memwatch-test")
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path / "mw"),
                        sinks=[WandbSink()], log_every_n_steps=5) as mw:
        for step in range(1, 21):
            mw.step()
            run.log({"loss": 1.0 / step})
        mw.end_epoch()
    data = finish(run)
    assert [s for s, _ in data.series("memwatch/host.rss_gib")] == [5, 10, 15, 20]
    assert len(data.history) == 20  # the script's rows only
    assert data.summary["memwatch/verdict"] == "ok" and data.summary["memwatch/findings"] == 0
    assert data.summary["memwatch/findings_total"] == 0
    assert data.summary_table("memwatch/findings_table") is None
    assert not [a for a in data.artifacts if a["type"].startswith(("memwatch", "memory"))]


def test_no_run_means_nothing_happens(tmp_path: Path) -> None:
    assert wandb.run is None
    sink = WandbSink()
    leak_run(tmp_path, [sink], epochs=2, steps=50, every=10)
    assert sink.run is None and sink.logged_artifacts == [] and sink.closed


def test_without_wandb_nothing_is_imported(tmp_path: Path, run_python: Any) -> None:
    proc = run_python(f"""
        import sys
        class NoWandb:
            def find_spec(self, name, path=None, target=None):
                if name == "wandb" or name.startswith("wandb."):
                    raise ImportError("no wandb here")
        sys.meta_path.insert(0, NoWandb())
        import memwatch
        from memwatch.sinks.wandb import WandbSink
        sink = WandbSink()
        with memwatch.watch(device="cpu", workers=False, out_dir={str(tmp_path)!r},
                            sinks=[sink], log_every_n_steps=1) as mw:
            for _ in range(3):
                mw.step()
            mw.end_epoch()
        assert "wandb" not in sys.modules and sink.run is None
        print("ok")
    """)
    assert proc.stdout.strip() == "ok"


def test_finished_run_is_left_alone(tmp_path: Path) -> None:
    run = wandb.init(project="memwatch-test")
    sink = WandbSink()
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp_path / "mw"),
                           sinks=[sink], log_every_n_steps=1)
    mw.start()
    mw.step()
    run.finish()  # the user finishes their run before memwatch closes
    mw.step()
    mw.end_epoch()
    mw.close()
    assert not mw._sinks.disabled


def test_a_ranks_run_has_the_same_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One key scheme for every loop and launcher: a rank's own run (wandb.init per rank) holds
    # that rank's memory under the keys every run has; the rank is in artifact names only.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    run = wandb.init(project="memwatch-test")
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path / "mw"),
                        sinks=[WandbSink()], log_every_n_steps=2, distributed="off") as mw:
        for step in range(4):
            mw.step()
            run.log({"loss": step})
    data = finish(run)
    assert data.series("memwatch/host.rss_gib")[-1][0] == 4
    assert not [k for r in data.history for k in r if k.startswith("memwatch/rank")]
    assert data.summary["memwatch/verdict"] == "ok"


def test_merge_mode_never_moves_the_users_steps(tmp_path: Path) -> None:
    # A trainer that logs with explicit steps (Accelerate does): memwatch rows join its rows.
    run = wandb.init(project="memwatch-test")
    sink = WandbSink()
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path / "mw"),
                        sinks=[sink], log_every_n_steps=5) as mw:
        for step in range(1, 21):
            mw.step()
            run.log({"loss": 1.0 / step}, step=step)
    data = finish(run)
    loss_steps = [r["_step"] for r in data.history if "loss" in r]
    assert loss_steps == list(range(1, 21))  # none dropped as "step went backwards"
    mem = [r for r in data.history if "memwatch/host.rss_gib" in r]
    assert [r["memwatch/step"] for r in mem] == [5, 10, 15, 20]
    assert all("loss" in r for r in mem)  # riding on the trainer's rows: no row of its own
    assert len(data.history) == 20


def test_find_run_through_framework_objects(tmp_path: Path) -> None:
    from accelerate.tracking import WandBTracker
    from lightning.pytorch.loggers import WandbLogger
    from transformers.integrations import WandbCallback

    assert find_run(None) == (None, "")
    logger = WandbLogger(project="memwatch-test", save_dir=str(tmp_path), offline=True)
    run, via = find_run(logger)
    assert via == "lightning" and run is logger.experiment and run is wandb.run
    assert find_run(WandbCallback()) == (run, "transformers")
    tracker = WandBTracker.__new__(WandBTracker)  # as Accelerate holds it after start()
    tracker.run = run
    assert find_run(tracker) == (run, "accelerate")
    sink = WandbSink(run=tracker)
    sink.on_metrics(1, {"host.rss": 1.0})
    assert sink.found_via == "accelerate" and sink._commit() is False
    wandb.finish()


@pytest.mark.parametrize("module", ["memwatch.sinks.wandb", "memwatch.testing.wandb_offline"])
def test_docstring_examples(module: str, tmp_path: Path) -> None:
    # The root conftest skips these modules' doctests (they need wandb); they run here.
    import importlib

    mod = importlib.import_module(module)
    res = doctest.testmod(mod, extraglobs={"tmp": str(tmp_path)}, optionflags=doctest.ELLIPSIS)
    assert res.attempted > 0 and res.failed == 0


def test_bundle_files_outside_the_manifest_are_not_uploaded(tmp_path: Path) -> None:
    run = wandb.init(project="memwatch-test")
    sink = WandbSink()
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp_path / "mw"),
                           sinks=[sink])
    mw.start()
    mw.step()
    path = mw.dump("look")
    assert path is not None
    mw.close()
    (path / "secrets.env").write_text("TOKEN=abc")  # not a bundle file: never uploaded
    sink.on_bundle(path, {})
    data = finish(run)
    arts = [a for a in data.artifacts if a["type"] == "memory-snapshot"]
    assert len(arts) == 2 and all("secrets.env" not in a["files"] for a in arts)
    assert sys.modules.get("wandb") is wandb


def test_a_leak_that_is_no_threat_is_not_ok(tmp_path: Path) -> None:
    # The same planted leak in a run planned for 300 steps: the limit is thousands of steps
    # away, so the leak is no threat (info), but it is still a leak: the summary names it and
    # the end-of-run report reaches the run.
    run = wandb.init(project="memwatch-test")
    sink = WandbSink()
    mw = leak_run(tmp_path, [sink], epochs=3, steps=100, every=25, total_steps=300)
    leaks = [f for f in mw.findings if f.kind == "leak"]
    assert leaks and {f.severity for f in leaks} == {"info"}
    data = finish(run)
    assert data.summary["memwatch/verdict"] == \
        "info: leak in device.allocated, not a threat to this run"
    assert data.summary["memwatch/verdict_kinds"] == ["leak:device.allocated"]
    assert "memwatch/worst_steps_to_oom" not in data.summary  # no threat: no "worst" forecast
    # One row per belief, its current state: the leak restated at every check is one row.
    rows = data.summary_table("memwatch/findings_table")["data"]  # type: ignore[index]
    assert [r[2:5] + r[9:10] for r in rows if r[2] == "leak"] == \
        [["leak", "device.allocated", "info", "leak"]]
    snap = [a for a in data.artifacts if a["type"] == "memory-snapshot"]
    assert len(snap) == 1 and "report.html" in snap[0]["files"], data.artifacts
    assert list(data.path.glob("files/media/html/memwatch/report_*.html"))


def test_a_leak_that_stops_is_withdrawn_in_the_summary_and_the_table(tmp_path: Path) -> None:
    # 2 MiB a step for two epochs, then flat for four: the leak verdict, then its withdrawal.
    run = wandb.init(project="memwatch-test")
    sink = WandbSink()
    mw = leak_run(tmp_path, [sink], epochs=6, steps=100, every=25, stop_after=2)
    now = [f for f in mw.current_findings() if f.metric == "device.allocated"]
    assert "leak" not in {f.kind for f in now}
    assert [f.evidence["belief_state"] for f in now if f.kind == "plateau"] == ["stopped"]
    data = finish(run)
    assert data.summary["memwatch/verdict"] == "ok"  # the current beliefs: none is a leak
    (gone,) = data.summary["memwatch/verdicts_withdrawn"]
    assert gone.startswith("device.allocated: leak at epoch 1") and "→ stopped at epoch" in gone
    table = data.summary_table("memwatch/findings_table")
    assert table is not None
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    (row,) = [r for r in rows if r["metric"] == "device.allocated" and r["kind"] == "plateau"]
    assert row["state"] == "stopped" and row["history"] == gone.split(": ", 1)[1]


def test_warnings_and_critical_findings_raise_alerts(tmp_path: Path) -> None:
    # Read back through W&B's own record of them (alerts="always": an offline run records them
    # for `wandb sync`; the default sends them only from an online run).
    run = wandb.init(project="memwatch-test")
    sink, quiet = WandbSink(alerts="always"), WandbSink(run=run)
    leak_run(tmp_path, [sink, quiet], epochs=3, steps=100, every=25)
    data = finish(run)
    assert [(a["title"], a["level"]) for a in data.alerts] == \
        [("memwatch: leak in device.allocated (warning)", "WARN")]
    assert "per step" in data.alerts[0]["text"] and quiet.alerts_sent == []


def test_an_evaluation_loop_has_its_own_keys(tmp_path: Path) -> None:
    run = wandb.init(project="memwatch-test")
    sink = WandbSink()
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path / "mw"),
                        sinks=[sink], log_every_n_steps=5) as mw, \
            memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path / "mw"),
                           sinks=[sink], stage="val", recorder=False) as val:
        for step in range(1, 21):
            mw.step()
            if step <= 5:
                val.step()
            elif step == 6:
                val.end_epoch()  # its figures ride on the next sample's row
            run.log({"loss": 1.0 / step})
        mw.end_epoch()
    data = finish(run)
    keys = {k for r in data.history for k in r}
    assert "memwatch/val/host.rss_gib" in keys and "memwatch/val/findings/count" in keys
    assert not [k for k in keys if k.startswith(("train/", "memwatch/train"))]
