"""``make gpu-check`` on a machine without CUDA: it runs what FakeDevice can, reports every part
(none silently skipped), says that no CUDA device is present, and exits 0."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_cuda_reports_every_part_and_exits_0(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: `make gpu-check` runs the real thing")
    gc = _load()
    assert gc.main(["--out", str(tmp_path), "--quick"]) == 0
    assert "no CUDA device is present" in capsys.readouterr().out
    doc = json.loads((tmp_path / "report.json").read_text())
    parts = doc["parts"]
    assert parts["gpu_tests"] == {"status": "not run", "reason": "no CUDA device"}
    assert parts["no_sync"]["status"] == "not run" and "no CUDA" in parts["no_sync"]["reason"]
    sc = parts["step_cost"]
    assert sc["status"] == "passed" and sc["device"] == "fake"
    assert set(sc["rows"]) == {"mw.step(), FakeDevice probe", "mw.step(), CPU only"}
    assert all(r["median_us"] > 0 for r in sc["rows"].values())
    # Every check of the list appears, each with a status and, when not run, a reason.
    assert {k for k in parts if k.startswith("2")} == set(gc.gpu_parts.PARTS)
    assert {k[:2] for k in parts if k.startswith("2")} == {"2c", "2d", "2e", "2f", "2g", "2h",
                                                          "2i"}
    # what FakeDevice can run, ran: the outside-allocator, private-pool and allocation-site code
    assert parts["fake_device_paths"]["status"] == "passed", parts["fake_device_paths"]
    assert all(p["status"] in ("passed", "failed", "not run") for p in parts.values())
    assert all(p.get("reason") for p in parts.values() if p["status"] == "not run")
    md = (tmp_path / "report.md").read_text()
    assert "no CUDA device present" in md and "| step_cost | passed |" in md
