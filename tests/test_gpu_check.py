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
    adapters = {name for name, *_ in gc.gpu_adapters.parts()}
    assert {k for k in parts if k.startswith("2")} == set(gc.gpu_parts.PARTS) | adapters
    assert {"2c_ratio_lightning", "2c_ratio_transformers", "2c_ratio_accelerate",
            "2d_oom_accelerate_expandable"} <= adapters
    assert {k[:2] for k in parts if k.startswith("2")} == {"2c", "2d", "2e", "2f", "2g", "2h",
                                                          "2i"}
    # what FakeDevice can run, ran: the outside-allocator, private-pool and allocation-site code
    assert parts["fake_device_paths"]["status"] == "passed", parts["fake_device_paths"]
    assert all(p["status"] in ("passed", "failed", "not run") for p in parts.values())
    assert all(p.get("reason") for p in parts.values() if p["status"] == "not run")
    md = (tmp_path / "report.md").read_text()
    assert "no CUDA device present" in md and "| step_cost | passed |" in md


def test_only_selects_the_child_parts(tmp_path: Path) -> None:
    gc = _load()
    assert gc.main(["--out", str(tmp_path), "--quick", "--only", "2d_oom_"]) in (0, 1)
    parts = json.loads((tmp_path / "report.json").read_text())["parts"]
    picked = {k for k in parts if k.startswith("2d_oom_")}
    assert len(picked) == 6
    others = [p for k, p in parts.items() if k.startswith("2") and k not in picked]
    assert others and all(p["status"] == "not run" and "--only" in p["reason"] for p in others)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["lightning", "transformers", "accelerate"])
def test_adapter_parts_run_on_cpu(framework: str, tmp_path: Path) -> None:
    """The adapter parts' code, small and on the CPU, so that it works the day a GPU is lent: the
    step-time ratio of alternating runs, and a real allocation failure (the host refuses 1 PiB)
    inside the framework's loop leaving exactly one bundle, classified host_oom, with a census."""
    import subprocess
    import sys

    script = REPO / "benchmarks" / "gpu_adapters.py"
    docs = {}
    for kind in ("ratio", "oom"):
        res = tmp_path / f"{kind}.json"
        subprocess.run([sys.executable, str(script), kind, framework, "cpu", str(res),
                        str(tmp_path)], check=True, timeout=240, capture_output=True)
        docs[kind] = json.loads(res.read_text())
    r, o = docs["ratio"], docs["oom"]
    assert r["status"] == "passed", r
    assert 0.2 < r["ratio"] < 5 and [run["mode"] for run in r["runs"]] == ["off", "on"]
    assert all(run["steps"] >= 5 for run in r["runs"])
    assert o["status"] == "passed", o
    assert o["classification"] == "host_oom" and o["census_groups"] > 0
    assert "can't allocate memory" in o["exception"]
