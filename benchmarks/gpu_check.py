"""``make gpu-check``: every CUDA path memwatch has, run on the GPU this machine has, with numbers.

Runs from a clean checkout with the machine's own ``python3`` and ``PYTHONPATH=src`` (nothing
installed). Each part reports ``passed``, ``failed``, or ``not run`` with the reason (a package
missing there, no CUDA device, a check not built yet); nothing is skipped silently. Without CUDA
the parts that can run on :class:`memwatch.testing.FakeDevice` do, the report says that no CUDA
device is present, and the exit status is 0. With CUDA the exit status is 1 when a part failed.

Writes ``report.md`` and ``report.json`` into ``--out`` (default ``gpu-check-out/``).

Parts (issue 18's list; the ones marked "not built" are reported as not run):

* ``environment``: Python, torch, CUDA, device, driver, which optional packages are present;
* ``gpu_tests``: ``pytest -m gpu tests/probes/test_gpu_cuda.py tests/runtime/test_recorder_gpu.py``;
* ``step_cost`` (2a): ``mw.step()`` with the device probe (median and p99 us) beside
  ``torch.cuda.memory_allocated()`` alone and beside the CPU-only session;
* ``no_sync`` (2b): a training loop under ``torch.cuda.set_sync_debug_mode("error")`` with
  memwatch on: any synchronisation memwatch adds raises;
* ``fake_device_paths``: ``pytest tests/probes/test_gpu_paths.py`` (device memory outside the
  allocator, private pools, the allocation-site join, on FakeDevice: runs with or without CUDA);
* 2c-2i, each in a child process of its own (``benchmarks/gpu_parts.py``): the bf16 step-time
  ratio of a plain loop, a real OOM inside ``watch()`` with and without expandable segments, a
  device leak joined to its allocation site, real fragmentation (and quiet with expandable
  segments), ``device.outside_allocator``, ``device.private_pools`` under a CUDA graph, and
  ``memwatch report`` / ``inspect`` of the OOM bundle;
* the adapters (``benchmarks/gpu_adapters.py``, a child process each): the bf16 step-time ratio
  of a GPT-2 from a config in a Lightning fit, an HF ``Trainer`` and an Accelerate loop
  (``2c_ratio_*``), and a real CUDA OOM inside each, with and without expandable segments
  (``2d_oom_*``).

``--only PREFIX`` (repeatable) runs only the child parts whose names start with it, for machines
lent 10 minutes a call: ``--only 2c_step --only 2d_real --only 2e --only 2f --only 2g --only 2h
--only 2i`` then ``--only 2c_ratio_ --only 2d_oom_`` into another folder.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

import memwatch  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_adapters  # noqa: E402
import gpu_parts  # noqa: E402


def _cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "memwatch": memwatch.__version__,
                           "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(
                               timespec="seconds")}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = torch.cuda.is_available()
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name(0)
            env["device_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    except ImportError:
        env["torch"] = None
        env["cuda_available"] = False
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        env["driver"] = smi.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["driver"] = None
    env["packages"] = {name: importlib.util.find_spec(name) is not None
                       for name in ("lightning", "transformers", "accelerate", "wandb", "plotly",
                                    "pytest", "pynvml", "rich")}
    return env


def gpu_tests(out: Path) -> dict[str, Any]:
    if _cuda() is None:
        return {"status": "not run", "reason": "no CUDA device"}
    if importlib.util.find_spec("pytest") is None:
        return {"status": "not run", "reason": "pytest is not installed here"}
    xml = out / "gpu-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
           f"--junitxml={xml}", "tests/probes/test_gpu_cuda.py",
           "tests/runtime/test_recorder_gpu.py"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    tail = (r.stdout + r.stderr)[-3000:]
    return {"status": "passed" if r.returncode == 0 else "failed", "exit": r.returncode,
            "output_tail": tail}


def _timed(fn: Callable[[], Any], n: int) -> dict[str, float]:
    ns = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ns.append(time.perf_counter_ns() - t0)
    ns.sort()
    return {"median_us": statistics.median(ns) / 1e3, "p99_us": ns[int(0.99 * (n - 1))] / 1e3}


def step_cost(n: int) -> dict[str, Any]:
    torch = _cuda()
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if torch is not None:
            rows["torch.cuda.memory_allocated()"] = _timed(torch.cuda.memory_allocated, n)
            dev: Any = "cuda"
            label = "mw.step(), CUDA probe"
        else:
            from memwatch.testing import FakeDevice

            dev = FakeDevice(total_bytes=16 << 30)
            label = "mw.step(), FakeDevice probe"
        for name, device in ((label, dev), ("mw.step(), CPU only", "cpu")):
            with memwatch.watch(device=device, workers=False, out_dir=f"{tmp}/{len(rows)}",
                                check_every_n_steps=None, check_every_s=None,
                                signals=False) as mw:
                rows[name] = _timed(mw.step, n)
    over = rows[label]["median_us"] > 10.0 and torch is not None
    return {"status": "failed" if over else "passed", "device": "cuda" if torch else "fake",
            "rows": rows, "note": "goal: the device read under ~10 us per step"}


def no_sync(steps: int) -> dict[str, Any]:
    torch = _cuda()
    if torch is None:
        return {"status": "not run", "reason": "no CUDA device (sync debug mode needs one)"}
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="cuda")
    with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
            device="cuda", workers=False, out_dir=tmp, signals=False) as mw:
        for _ in range(10):  # warm-up outside the debug mode (lazy init may sync)
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
            mw.step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                model(x).pow(2).mean().backward()
                opt.step()
                mw.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return {"status": "passed", "steps": steps}


def fake_device_paths() -> dict[str, Any]:
    if importlib.util.find_spec("pytest") is None:
        return {"status": "not run", "reason": "pytest is not installed here"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/probes/test_gpu_paths.py"], cwd=REPO, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    return {"status": "passed" if r.returncode == 0 else "failed", "exit": r.returncode,
            "note": "on FakeDevice", "output_tail": (r.stdout + r.stderr)[-1500:]}


def _guard(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a part that breaks is reported, the rest still runs
        return {"status": "failed", "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:]}


def render(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    lines = ["# memwatch gpu-check", "",
             f"- date (UTC): {env['date_utc']}", f"- memwatch {env['memwatch']}, Python "
             f"{env['python']}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')})",
             f"- device: {env.get('device') or 'no CUDA device present'}; driver "
             f"{env.get('driver')}",
             "- packages: " + ", ".join(f"{k} {'yes' if v else 'no'}"
                                        for k, v in env["packages"].items()), "",
             "| part | status | detail |", "|---|---|---|"]
    for name, part in doc["parts"].items():
        detail = part.get("reason") or part.get("error") or part.get("note") or ""
        lines.append(f"| {name} | {part['status']} | {detail} |")
    sc = doc["parts"].get("step_cost", {}).get("rows")
    if sc:
        lines += ["", "Per-step cost:", "", "| read | median us | p99 us |", "|---|---|---|"]
        lines += [f"| {k} | {v['median_us']:.2f} | {v['p99_us']:.2f} |" for k, v in sc.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check-out", help="folder for report.md and report.json")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--only", action="append", metavar="PREFIX", default=[],
                    help="run only the child parts (2c-2i) whose name starts with PREFIX "
                         "(repeatable; e.g. --only 2c_ratio_ --only 2d_oom_): the whole check "
                         "takes longer than one 10-minute call on a lent machine")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = 2_000 if args.quick else 20_000
    parts: dict[str, dict[str, Any]] = {
        "gpu_tests": _guard(lambda: gpu_tests(out)),
        "step_cost": _guard(lambda: step_cost(n)),
        "no_sync": _guard(lambda: no_sync(50 if args.quick else 500)),
    }
    parts["fake_device_paths"] = _guard(fake_device_paths)
    children: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
        (key, what, lambda key=key: gpu_parts.run_part(key, out))
        for key, (what, _timeout) in gpu_parts.PARTS.items()]
    children += [(key, what, lambda key=key: gpu_adapters.run_part(key, out))
                 for key, _kind, _fw, what in gpu_adapters.parts()]
    for key, what, run in children:
        if args.only and not any(key.startswith(p) for p in args.only):
            parts[key] = {"status": "not run", "reason": f"not selected (--only): {what}"}
        elif _cuda() is None:
            parts[key] = {"status": "not run", "reason": f"no CUDA device: {what}"}
        else:
            parts[key] = _guard(run)
    doc = {"environment": environment(), "parts": parts}
    (out / "report.json").write_text(json.dumps(doc, indent=1, default=str))
    (out / "report.md").write_text(render(doc))
    print(render(doc))
    if not doc["environment"].get("cuda_available"):
        print("no CUDA device is present: the CUDA parts were not run (exit 0)")
        return 0
    return 1 if any(p["status"] == "failed" for p in parts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
