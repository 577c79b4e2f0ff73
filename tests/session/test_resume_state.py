"""MemWatch.state_dict()/load_state_dict(): verdicts that span a restart (scripted FakeDevice)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memwatch
from memwatch import MemWatch
from memwatch.runtime.resume import summary_from_state, summary_to_state
from memwatch.testing import FakeDevice

GIB = 1 << 30
STEPS = 300
RATE = 100_000  # bytes per step: a leak from the first step on


def _session(tmp_path: Path, dev: FakeDevice) -> MemWatch:
    return MemWatch(device=dev, host=False, workers=False, out_dir=str(tmp_path),
                    census="never")


def _epoch(mw: MemWatch, dev: FakeDevice, start: int) -> list[memwatch.Finding]:
    for i in range(STEPS):
        a = 200_000_000 + (start + i) * RATE
        dev.set(allocated=a, reserved=a)
        mw.step()
    return mw.end_epoch()


def _leaks(findings: list[memwatch.Finding]) -> list[memwatch.Finding]:
    return [f for f in findings if f.kind == "leak" and f.metric == "device.allocated"]


def _json(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state, allow_nan=False))  # strict JSON
    return out


def _saved(tmp_path: Path, epochs: int) -> tuple[dict[str, Any], list[list[memwatch.Finding]]]:
    dev = FakeDevice(total_bytes=8 * GIB)
    with _session(tmp_path / "before", dev) as mw:
        per_epoch = [_epoch(mw, dev, e * STEPS) for e in range(epochs)]
        state = mw.state_dict()
    return _json(state), per_epoch


@pytest.mark.parametrize("load_before_start", [True, False])
def test_a_leak_from_before_the_restart_is_confirmed_at_the_first_epoch_after(
        tmp_path: Path, load_before_start: bool) -> None:
    state, before = _saved(tmp_path, epochs=1)
    assert not _leaks(before[0])  # one epoch cannot confirm a leak
    assert state["step_count"] == STEPS and len(state["epochs"]) == 1

    dev = FakeDevice(total_bytes=8 * GIB)
    mw = _session(tmp_path / "after", dev)
    if load_before_start:
        mw.load_state_dict(state)
        assert mw.epochs == []  # applied at start()
    mw.start()
    if not load_before_start:
        mw.load_state_dict(state)
    try:
        assert mw.step_count == STEPS and mw.epoch == 1
        new = _epoch(mw, dev, STEPS)
        assert _leaks(new), [f.to_dict() for f in new]
        assert new[0].epoch == 1 and new[0].step == 2 * STEPS
        restored, fresh = mw.epochs
        assert (restored.epoch, fresh.epoch) == (0, 1)
        assert fresh.start_step == restored.end_step + 1 == STEPS + 1
    finally:
        mw.close()

    # The same resume without the state: the new session needs two epochs of its own.
    dev = FakeDevice(total_bytes=8 * GIB)
    with _session(tmp_path / "fresh", dev) as fresh_mw:
        assert not _leaks(_epoch(fresh_mw, dev, STEPS))
        assert fresh_mw.step_count == STEPS


def test_findings_from_before_the_restart_are_kept_and_not_reported_again(
        tmp_path: Path) -> None:
    state, before = _saved(tmp_path, epochs=2)
    reported = _leaks(before[1])
    assert reported and not _leaks(before[0])

    dev = FakeDevice(total_bytes=8 * GIB)
    with _session(tmp_path / "after", dev) as mw:
        mw.load_state_dict(state)
        # The replay through the analyzer reported nothing: the restored list is the saved one.
        assert [f.to_dict() for f in mw.findings] == state["findings"]
        new = _epoch(mw, dev, 2 * STEPS)
    assert all(f.epoch == 2 for f in new) and _leaks(new)
    assert [f.epoch for f in _leaks(mw.findings)] == [1, 2]


def test_state_is_plain_data_for_torch_weights_only(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    dev = FakeDevice(total_bytes=8 * GIB)
    with _session(tmp_path, dev) as mw:
        for e in range(2):
            _epoch(mw, dev, e * STEPS)
        # A NaN column (a probe that failed) must not break strict JSON.
        assert mw.timeline is not None
        mw.timeline.epochs[0].floor[0] = np.nan
        state = mw.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert back == _json(state)
    assert back["epochs"][0]["floor"][0] is None


def test_columns_are_remapped_by_name(tmp_path: Path) -> None:
    state, _ = _saved(tmp_path, epochs=1)
    saved = state["epochs"][0]
    keys = ("host.rss", "device.allocated")  # one new metric, most old ones gone
    e = summary_from_state(saved, keys)
    col = saved["keys"].index("device.allocated")
    assert np.isnan(e.floor[0]) and e.floor[1] == saved["floor"][col]
    assert e.bucket_floor is not None and e.bucket_floor.shape[1] == 2
    assert np.isnan(e.bucket_floor[:, 0]).all()
    assert summary_to_state(summary_from_state(saved, saved["keys"])) == saved


@pytest.mark.parametrize("state", [
    {"version": 99, "step_count": 5, "epochs": []},
    {"step_count": 5},
    "not a dict",
    None,
    {"version": 1, "step_count": 300, "epochs": [{"epoch": 0, "keys": ["x"]}]},
    {"version": 1, "step_count": "many", "epochs": []},
])
def test_an_unusable_state_warns_and_starts_fresh(tmp_path: Path, state: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    dev = FakeDevice(total_bytes=8 * GIB)
    mw = _session(tmp_path, dev)
    mw.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="memwatch"), mw:
        assert mw.running
        assert mw.step_count == 0 and mw.epochs == [] and mw.findings == []
        _epoch(mw, dev, 0)
        assert mw.step_count == STEPS
    assert any("starts fresh" in r.getMessage() for r in caplog.records)


def test_a_state_given_after_an_epoch_end_is_not_applied(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state, _ = _saved(tmp_path, epochs=1)
    dev = FakeDevice(total_bytes=8 * GIB)
    with _session(tmp_path / "after", dev) as mw, \
            caplog.at_level(logging.WARNING, logger="memwatch"):
        _epoch(mw, dev, 0)
        mw.load_state_dict(state)
        assert len(mw.epochs) == 1 and mw.step_count == STEPS
    assert any("not restored" in r.getMessage() for r in caplog.records)


def test_state_dict_before_start_returns_the_pending_state(tmp_path: Path) -> None:
    state, _ = _saved(tmp_path, epochs=1)
    mw = _session(tmp_path / "after", FakeDevice())
    assert mw.state_dict()["epochs"] == []
    mw.load_state_dict(state)
    assert mw.state_dict() == state  # saving again before start loses nothing


def test_the_lightning_layout_of_earlier_versions_still_loads(tmp_path: Path) -> None:
    from memwatch.integrations._state import read_adapter_state

    state, before = _saved(tmp_path, epochs=2)
    train = {k: state[k] for k in ("step_count", "epoch", "epochs")}  # no version, no findings
    for e in train["epochs"]:  # NaN, as the old writer left it (tolist of float arrays)
        e["floor"] = [float("nan") if v is None else v for v in e["floor"]]
    val = {**state["findings"][0], "evidence": {"stage": "val"}}
    old = {"version": 1, "findings": state["findings"] + [val], "warned": [["train", "leak",
                                                                            "device.allocated"]],
           "train": train}
    restored = read_adapter_state(old)
    assert restored is not None and restored.train is not None
    assert restored.warned == {("train", "leak", "device.allocated")}
    assert len(restored.findings) == len(state["findings"]) + 1
    dev = FakeDevice(total_bytes=8 * GIB)
    with _session(tmp_path / "after", dev) as mw:
        mw.load_state_dict(restored.train)
        assert [e.epoch for e in mw.epochs] == [0, 1] and mw.step_count == 2 * STEPS
        assert [f.to_dict() for f in mw.findings] == state["findings"]  # training ones only
        assert _leaks(_epoch(mw, dev, 2 * STEPS))
    assert read_adapter_state({"version": 2}) is None
