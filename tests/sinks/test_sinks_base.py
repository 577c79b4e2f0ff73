"""The sink protocol as the session drives it: cadence, findings, bundles, close, failures;
the in-memory and JSONL sinks; CSV/JSON timeline export."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

import memwatch
from memwatch.bundle.export import to_csv, to_json
from memwatch.core.errors import ConfigError
from memwatch.sinks import JsonlSink, MemorySink, Sink
from memwatch.sinks.jsonl import read_events
from memwatch.testing import FakeDevice
from sinks_helpers import GIB, MIB, leak_run


def test_cadence_findings_bundle_close(tmp_path: Path) -> None:
    sink = MemorySink()
    assert isinstance(sink, Sink)
    mw = leak_run(tmp_path, [sink], oom=True)
    assert [s for s, _ in sink.metrics] == list(range(25, 301, 25))
    step, sample = sink.metrics[-1]
    assert sample["device.allocated"] == pytest.approx(GIB + 299 * 2 * MIB, abs=1e6)
    assert [e for e, _, _ in sink.epochs] == [0, 1, 2]
    assert [s.end_step for _, _, s in sink.epochs] == [100, 200, 300]
    assert any(f.kind == "leak" and f.metric == "device.allocated" for f in sink.findings)
    assert len(sink.bundles) == 1
    path, manifest = sink.bundles[0]
    assert path == mw.recorder.bundles[-1]  # type: ignore[union-attr]
    assert manifest["classification"] == "cuda_oom" and (path / "manifest.json").is_file()
    assert sink.closed


def test_cadence_is_multiples_of_n_after_a_resume(tmp_path: Path) -> None:
    sink = MemorySink()
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp_path), sinks=[sink],
                           log_every_n_steps=10, recorder=False, watchdog=False)
    mw.start()
    # A resumed run continues its step numbers.
    mw.load_state_dict({"version": 1, "step_count": 95, "epoch": 0, "epochs": [], "findings": []})
    for _ in range(20):
        mw.step()
    mw.close()
    assert [s for s, _ in sink.metrics] == [100, 110]


def test_no_sink_no_tick(tmp_path: Path) -> None:
    # Without sinks, recorder or watchdog, step() never leaves its one integer compare.
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=str(tmp_path), recorder=False,
                           watchdog=False, check_every_n_steps=None, check_every_s=None)
    mw.start()
    try:
        assert mw._scheduler.next_due == sys.maxsize
        mw.add_sink(MemorySink())
        assert mw._scheduler.next_due == 50
    finally:
        mw.close()


class Exploding(MemorySink):
    def on_metrics(self, step: int, sample: Any) -> None:
        super().on_metrics(step, sample)
        raise RuntimeError("disk full")


def test_failing_sink_warns_once_and_is_disabled(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    bad, good = Exploding(), MemorySink()
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path),
                            sinks=[bad, good], log_every_n_steps=2) as mw:
            for _ in range(10):
                mw.step()
            mw.end_epoch()
    msgs = [r.getMessage() for r in caplog.records if "sink" in r.getMessage()]
    assert len(msgs) == 1 and "Exploding" in msgs[0] and "disk full" in msgs[0], msgs
    assert len(bad.metrics) == 1 and not bad.epochs and not bad.closed  # disabled after it
    assert len(good.metrics) == 5 and len(good.epochs) == 1 and good.closed
    assert mw.step_count == 10


def test_bad_configuration_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="log_every_n_steps"):
        memwatch.MemWatch(device="cpu", out_dir=str(tmp_path), log_every_n_steps=0)
    with pytest.raises(ConfigError, match="not a sink"):
        memwatch.MemWatch(device="cpu", out_dir=str(tmp_path), sinks=[object()])
    with pytest.raises(ConfigError, match="list of sink"):
        memwatch.MemWatch(device="cpu", out_dir=str(tmp_path), sinks="wandb")
    with pytest.raises(ConfigError, match="max_files"):
        JsonlSink(tmp_path / "x.jsonl", max_files=0)


class WantsFinal(MemorySink):
    wants_final_bundle = True


def test_a_sink_can_ask_for_an_end_of_run_bundle(tmp_path: Path) -> None:
    sink, other = WantsFinal(), MemorySink()
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path),
                        sinks=[sink, other]) as mw:
        mw.step()
    assert len(sink.bundles) == 1 and len(other.bundles) == 1
    path, manifest = sink.bundles[0]
    assert manifest["trigger"] == "end_of_run" and (path / "report.html").is_file()


def test_exception_in_flight_reaches_the_sinks_before_close(tmp_path: Path) -> None:
    dev, sink = FakeDevice(total_bytes=64 * MIB), MemorySink()
    mw = memwatch.MemWatch(device=dev, host=False, workers=False, out_dir=str(tmp_path),
                           sinks=[sink])
    with pytest.raises(Exception, match="(?i)out of memory"):  # noqa: PT012
        with mw:
            mw.step()
            dev.malloc(128 * MIB)
    assert len(sink.bundles) == 1 and sink.bundles[0][1]["classification"] == "cuda_oom"


def test_jsonl_events_and_rotation(tmp_path: Path) -> None:
    log_path = tmp_path / "logs" / "events.jsonl"
    sink = JsonlSink(log_path, max_bytes=4096, max_files=3)
    leak_run(tmp_path, [sink], epochs=3, steps=100, every=2, oom=True)
    files = sorted(p.name for p in log_path.parent.iterdir())
    assert files == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"], files
    assert all(p.stat().st_size <= 4096 for p in log_path.parent.iterdir())
    events = read_events(log_path)
    # Bounded: the oldest files went, so the log starts mid-run but ends with the whole story.
    kinds = [e["event"] for e in events]
    assert kinds[-2:] == ["bundle", "close"], kinds[-5:]
    samples = [e for e in events if e["event"] == "sample"]
    steps = [e["step"] for e in samples]
    assert steps == sorted(steps) and steps[-1] == 300 and all(s % 2 == 0 for s in steps)
    assert all(e["rank"] == 0 for e in events)
    fnd = [e for e in events if e["event"] == "findings"]
    assert fnd and fnd[-1]["end_step"] == 300
    assert any(f["kind"] == "leak" for e in fnd for f in e["findings"])
    assert events[-2]["manifest"]["classification"] == "cuda_oom"
    for line in log_path.read_text().splitlines():
        json.loads(line)  # strict JSON: no NaN


def test_jsonl_rank_gets_its_own_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r9")
    sink = JsonlSink(tmp_path / "events.jsonl", rank=3)
    sink.on_metrics(1, {"host.rss": float("nan")})
    sink.close()
    events = read_events(tmp_path / "events.rank3.jsonl")
    assert [e["event"] for e in events] == ["start", "sample", "close"]
    assert events[1]["metrics"] == {"host.rss": None} and events[1]["rank"] == 3
    # the file says where it comes from: host, local rank, world size, job
    start = events[0]
    assert (start["local_rank"], start["world_size"], start["job"]) == (1, 4, "torchelastic-r9")
    assert start["host"] and start["rank"] == 3


def test_export_csv_and_json(tmp_path: Path) -> None:
    mw = leak_run(tmp_path, [], epochs=2, steps=50)
    p = to_csv(mw.timeline, tmp_path / "out" / "timeline.csv")
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 100 and rows[0]["step"] == "1" and rows[-1]["step"] == "100"
    assert float(rows[-1]["device.allocated"]) == pytest.approx(GIB + 99 * 2 * MIB, abs=1e6)
    assert float(rows[0]["time_s"]) == 0.0
    doc = json.loads(to_json(mw, tmp_path / "timeline.json").read_text())
    assert doc["samples"]["step"][:3] == [1, 2, 3] and "device.allocated" in doc["keys"]
    assert [e["epoch"] for e in doc["epochs"]] == [0, 1]
    assert not list(tmp_path.glob("out/.*part"))  # atomic: no temporary left
    with pytest.raises(ConfigError, match="timeline"):
        to_csv(memwatch.MemWatch(device="cpu", out_dir=str(tmp_path)), tmp_path / "x.csv")


class OlderForm:
    """A third-party sink written for the older protocol: on_findings, no on_check."""

    def __init__(self) -> None:
        self.epochs: list[tuple[int, int]] = []

    def on_metrics(self, step: int, sample: Any) -> None: ...

    def on_findings(self, epoch: int, findings: Any, summary: Any) -> None:
        self.epochs.append((epoch, summary.end_step))

    def on_bundle(self, path: Any, manifest: Any) -> None: ...

    def close(self) -> None: ...


def test_every_check_reaches_every_built_in_sink(tmp_path: Path) -> None:
    # One fan-out shared by a training session (an epoch end and checks inside the epoch) and an
    # evaluation session, as the framework adapters share it.
    from memwatch.runtime.dispatch import SinkSet

    mem, older = MemorySink(), OlderForm()
    jsonl = JsonlSink(tmp_path / "events.jsonl")
    sinks = SinkSet([mem, jsonl, older])
    cfg = memwatch.WatchConfig(device="cpu", workers=False, out_dir=str(tmp_path / "mw"),
                               sinks=sinks, check_every_n_steps=20, check_every_s=None,
                               recorder=False, census="never")
    train = memwatch.MemWatch.from_config(cfg).start()
    val = memwatch.MemWatch.from_config(cfg.for_evaluation("val")).start()
    for _ in range(50):
        train.step()
    train.end_epoch()
    for _ in range(5):
        val.step()
    val.end_epoch()
    val.close()
    train.close()
    sinks.close()
    seen = [(r.stage, r.at, r.step) for r in mem.reports]
    assert seen == [("train", "interval", 20), ("train", "interval", 40),
                    ("train", "epoch_end", 50), ("val", "epoch_end", 5)], seen
    events = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "findings"]
    assert [(e["stage"], e["at"], e["step"]) for e in events] == seen
    # The older form still works, for training checks only.
    assert older.epochs == [(0, 20), (0, 40), (0, 50)]
    assert [e for e, _, _ in mem.epochs] == [0, 0, 0] and not sinks.disabled


def test_a_sink_needs_a_check_method(tmp_path: Path) -> None:
    class NoChecks:
        def on_metrics(self, step: int, sample: Any) -> None: ...
        def on_bundle(self, path: Any, manifest: Any) -> None: ...
        def close(self) -> None: ...

    with pytest.raises(ConfigError, match="missing on_check"):
        memwatch.MemWatch(device="cpu", out_dir=str(tmp_path), sinks=[NoChecks()])
    assert isinstance(MemorySink(), Sink) and not isinstance(OlderForm(), Sink)


def test_sinks_get_the_committed_manifest(tmp_path: Path) -> None:
    sink = MemorySink()
    with memwatch.watch(device="cpu", workers=False, out_dir=str(tmp_path), sinks=[sink]) as mw:
        mw.step()
        path = mw.dump("look")
    assert path is not None
    got = dict(sink.bundles)[path]
    # What the recorder committed, not the dict it started from: every file is listed.
    assert got["complete"] is True and "report.html" in got["files"], got
