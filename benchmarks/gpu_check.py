"""``make gpu-check``: every CUDA path memwatch has, run on the GPU this machine has, with numbers,
in one call of a few minutes (issue 28: a lent machine gives a session 15 minutes in all).

Runs from a clean checkout with the machine's own ``python3`` and ``PYTHONPATH=src`` (nothing
installed). Each part reports ``passed``, ``failed``, or ``not run`` with the reason (a package
missing there, no CUDA device, its time box spent); nothing is skipped silently. Without CUDA the
parts that can run on :class:`memwatch.testing.FakeDevice` do, the report says that no CUDA device
is present, and the exit status is 0. With CUDA the exit status is 1 when a part failed.

The plan, in the order of what a lent machine is for (``PLAN``), each part with a time box:

1. alone, in this process: ``step_cost`` (``mw.step()`` on the CUDA probe, median and p99 us,
   beside the reads it is made of) and ``syncs`` (the synchronisations memwatch makes, counted
   under ``torch.cuda.set_sync_debug_mode("warn")``, then a loop under ``"error"``);
2. side by side, ``--jobs`` child processes at a time (none of them is timed): the real CUDA
   OOM bundles (plain loop and each adapter, with and without expandable segments), the device
   leak joined to its allocation site, fragmentation (and quiet with expandable segments),
   private pools under a CUDA graph, ``memwatch report``/``inspect`` of the plain OOM bundle, the
   ``pytest -m gpu`` tests and the FakeDevice tests;
3. alone again: memory outside the allocator (a device-wide read: nothing else may run), then the
   bf16 step-time ratios of a GPT-2-small step (plain loop, Lightning, HF ``Trainer``,
   Accelerate), each with its 95% interval and the synchronisations memwatch made.

A part starts only while its window has time left, and is killed at its box or at the window's
end, whichever is first; ``--budget-s`` is the whole call. ``report.json``, ``report.md`` and
``log.txt`` are rewritten after every part, in ``--out`` and in ``--publish`` (the lent machine's
``$OUT``, which returns at most 8 files), so a call killed at its limit still returns what it
finished. ``--rehearse`` (a CPU machine) runs the same plan with the adapters small on the CPU and
every child started, to try the exact command before a GPU is lent.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
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
from gpu_common import SyncCounter  # noqa: E402
from gpu_schedule import Check, Part  # noqa: E402


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


def gpu_tests(out: Path, timeout: int) -> dict[str, Any]:
    if _cuda() is None:
        return {"status": "not run", "reason": "no CUDA device"}
    if importlib.util.find_spec("pytest") is None:
        return {"status": "not run", "reason": "pytest is not installed here"}
    xml = out / "gpu-tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
           f"--junitxml={xml}", "tests/probes/test_gpu_cuda.py",
           "tests/runtime/test_recorder_gpu.py"]
    try:
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"timed out after {timeout} s"}
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
    """``mw.step()`` with the device probe, beside the reads it is made of: the allocator's
    counters (``torch._C._cuda_memoryStats``, the one read per step), the probe's whole fast read,
    and ``torch.cuda.memory_allocated()`` (what a callback that logs device memory calls)."""
    torch = _cuda()
    rows: dict[str, Any] = {}
    counters: tuple[str, ...] = ()
    with tempfile.TemporaryDirectory() as tmp:
        if torch is not None:
            from memwatch.probes.cuda import CudaProbe

            probe = CudaProbe(use_nvml=False)
            counters = probe.fast_keys
            rows["torch._C._cuda_memoryStats(i)"] = _timed(
                lambda: torch._C._cuda_memoryStats(probe.index), n)
            rows["CudaProbe.read_fast()"] = _timed(probe.read_fast, n)
            rows["torch.cuda.memory_allocated()"] = _timed(torch.cuda.memory_allocated, n)
            dev: Any = "cuda"
            label = "mw.step(), CUDA probe"
        else:
            from memwatch.testing import FakeDevice

            dev = FakeDevice(total_bytes=16 << 30)
            label = "mw.step(), FakeDevice probe"
        runs = [(label, dev), ("mw.step(), CPU only", "cpu")]
        if torch is not None:  # a step of 10 ms or more: the counters are read at every step
            runs.insert(1, ("mw.step(), CUDA probe, counters read every call", "cuda-every"))
        for name, device in runs:
            every = device == "cuda-every"
            if every:
                gate = CudaProbe.fast_min_interval_s
                CudaProbe.fast_min_interval_s = 0.0
            try:
                with memwatch.watch(device="cuda" if every else device, workers=False,
                                    out_dir=f"{tmp}/{len(rows)}", check_every_n_steps=None,
                                    check_every_s=None, signals=False) as mw:
                    for _ in range(100):
                        mw.step()
                    rows[name] = _timed(mw.step, n)
            finally:
                if every:
                    CudaProbe.fast_min_interval_s = gate
    over = rows[label]["median_us"] > 10.0 and torch is not None
    return {"status": "failed" if over else "passed", "device": "cuda" if torch else "fake",
            "rows": rows, "counters_per_step": list(counters),
            "note": "goal: mw.step() on the CUDA probe under ~10 us (median) in a tight loop; "
                    "a step that reads the counters costs the 'read every call' row"}


def syncs(steps: int) -> dict[str, Any]:
    """The synchronisations memwatch makes in a training loop with checks every 16 steps and an
    epoch end (census included), the background sampler running: counted under the "warn" sync
    debug mode (each attributed by its Python stack), then the same loop under "error"."""
    torch = _cuda()
    if torch is None:
        return {"status": "not run", "reason": "no CUDA device (sync debug mode needs one)"}
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="cuda")
    kept: list[Any] = []

    def train(mw: Any, n: int) -> None:
        for i in range(n):
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            opt.step()
            if i % 10 == 0:
                kept.append(torch.empty(1 << 18, device="cuda"))  # something for checks to see
            mw.step()

    with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
            device="cuda", workers=False, out_dir=tmp, signals=False,
            check_every_n_steps=16) as mw:
        train(mw, 20)  # warm-up outside the debug mode (lazy initialisation may synchronise)
        torch.cuda.synchronize()
        with SyncCounter() as counter:
            for _epoch in range(2):
                train(mw, steps)
                mw.end_epoch()
            deadline = time.monotonic() + 2.5  # the background sampler reads meanwhile
            while time.monotonic() < deadline:
                train(mw, 10)
        counted = counter.result()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            train(mw, steps)
            mw.end_epoch()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        disabled = dict(mw.disabled)
    ok = counted["syncs_memwatch"] == 0 and not disabled
    return {"status": "passed" if ok else "failed", **counted, "steps": 2 * steps,
            "disabled_components": disabled,
            "note": "checks every 16 steps and two epoch ends inside the counted window"}


def fake_device_paths(timeout: int) -> dict[str, Any]:
    if importlib.util.find_spec("pytest") is None:
        return {"status": "not run", "reason": "pytest is not installed here"}
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/probes/test_gpu_paths.py"], cwd=REPO, capture_output=True,
                           text=True, timeout=timeout,
                           env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"timed out after {timeout} s"}
    return {"status": "passed" if r.returncode == 0 else "failed", "exit": r.returncode,
            "note": "on FakeDevice", "output_tail": (r.stdout + r.stderr)[-1500:]}


# --------------------------------------------------------------------------- the plan

def plan(out: Path, quick: bool) -> list[Part]:
    """Every part, in the order a lent machine should run them."""
    n = 2_000 if quick else 20_000
    parts = [
        Part("step_cost", "mw.step() on the CUDA probe, median and p99 us", 1, 40,
             lambda t, d: step_cost(n), cpu=True),
        Part("syncs", "synchronisations made by memwatch: counted (warn), then none (error)", 1,
             40, lambda t, d: syncs(50 if quick else 200)),
    ]
    child = {k: v for k, v in gpu_parts.PARTS.items()}
    for key in ("2d_real_oom", "2d_real_oom_expandable"):
        parts.append(Part(key, child[key][0], 2, child[key][1],
                          lambda t, d, key=key: gpu_parts.run_part(key, out, t)))
    for key, kind, _fw, what in gpu_adapters.parts():
        if kind == "oom":
            parts.append(Part(key, what, 2, 120,
                              lambda t, d, key=key: gpu_adapters.run_part(key, out, t, d)))
    for key in ("2e_leak_with_allocation_site", "2f_stable_holes", "2f_stable_holes_expandable",
                "2h_private_pools"):
        parts.append(Part(key, child[key][0], 2, child[key][1],
                          lambda t, d, key=key: gpu_parts.run_part(key, out, t)))
    parts += [
        Part("2i_report_of_gpu_bundle", child["2i_report_of_gpu_bundle"][0], 2,
             child["2i_report_of_gpu_bundle"][1],
             lambda t, d: gpu_parts.run_part("2i_report_of_gpu_bundle", out, t),
             after="2d_real_oom"),
        Part("gpu_tests", "pytest -m gpu: the CUDA probe and the recorder's CUDA tests", 2, 150,
             lambda t, d: gpu_tests(out, t)),
        Part("fake_device_paths", "pytest tests/probes/test_gpu_paths.py (FakeDevice)", 2, 120,
             lambda t, d: fake_device_paths(t), cpu=True),
        Part("2g_outside_allocator", child["2g_outside_allocator"][0], 3,
             child["2g_outside_allocator"][1],
             lambda t, d: gpu_parts.run_part("2g_outside_allocator", out, t)),
        Part("2c_step_time_ratio", child["2c_step_time_ratio"][0], 3,
             child["2c_step_time_ratio"][1],
             lambda t, d: gpu_parts.run_part("2c_step_time_ratio", out, t)),
    ]
    for key, kind, _fw, what in gpu_adapters.parts():
        if kind == "ratio":
            parts.append(Part(key, what, 3, 80,
                              lambda t, d, key=key: gpu_adapters.run_part(key, out, t, d)))
    return parts


def collect(out: Path, publish: Path) -> None:
    """Into ``--publish`` (at most 8 files come back from a lent machine): the plain OOM
    bundle as a tarball, the HTML report of it and the gpu tests' JUnit XML, each if small."""
    if publish == out:
        return
    from memwatch.bundle import find_bundles

    found = [p for p, b in find_bundles(out / "oom-plain" / "oom")
             if not isinstance(b, Exception)] if (out / "oom-plain").exists() else []
    if found:
        tgz = publish / "gpu-oom-bundle.tar.gz"
        with tarfile.open(tgz, "w:gz") as tar:
            tar.add(found[0], arcname=found[0].name)
        if tgz.stat().st_size > 15 << 20:  # a lent machine returns files up to 16 MiB
            tgz.unlink()
    for name in ("gpu-bundle-report.html", "gpu-tests.xml"):
        f = out / name
        if f.exists() and f.stat().st_size < 8 << 20:
            shutil.copy(f, publish / name)


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
    sy = doc["parts"].get("syncs", {})
    if "syncs_total" in sy:
        lines += ["", f"Synchronisations while counted: {sy['syncs_total']} in all, "
                  f"{sy['syncs_memwatch']} with a memwatch frame on the stack "
                  f"{sy.get('memwatch_sites') or ''}"]
    ratios = {k: v for k, v in doc["parts"].items() if "interval_95" in v}
    if ratios:
        lines += ["", "Step-time ratios (memwatch on / off, median of blocks, 95% interval):", "",
                  "| part | off ms | on ms | ratio | interval | memwatch syncs |",
                  "|---|---|---|---|---|---|"]
        for k, v in ratios.items():
            lo, hi = v["interval_95"]
            ms = v["median_step_ms"]
            sync = (v.get("syncs") or {}).get("syncs_memwatch", "")
            lines.append(f"| {k} | {ms['off']:.2f} | {ms['on']:.2f} | {v['ratio']:.4f} | "
                         f"{lo:.4f}-{hi:.4f} | {sync} |")
    ooms = {k: v for k, v in doc["parts"].items() if "classification" in v}
    if ooms:
        lines += ["", "Out-of-memory bundles:", "",
                  "| part | classification | before unwind | segments | bundle bytes |",
                  "|---|---|---|---|---|"]
        lines += [f"| {k} | {v['classification']} | {v.get('pre_unwind')} | "
                  f"{v.get('segments')} | {v.get('bundle_bytes')} |" for k, v in ooms.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu-check-out", help="folder for the parts' files and the "
                    "report (report.md, report.json, log.txt)")
    ap.add_argument("--publish", default=None, help="a second folder that gets the report, the "
                    "log and a few small files after every part (a lent machine's $OUT)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds for the whole check (default 420: one 7-minute call)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="child parts side by side in window 2 (default 4 on CUDA, else 2)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--rehearse", action="store_true",
                    help="without CUDA: start every child part (the adapters run small on the "
                         "CPU; the others answer that there is no CUDA device), to try the "
                         "exact command before a GPU is lent")
    ap.add_argument("--only", action="append", metavar="PREFIX", default=[],
                    help="run only the parts whose name starts with PREFIX (repeatable; e.g. "
                         "a rerun of the failed ones)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    publish = Path(args.publish) if args.publish else out
    for d in (out, publish):
        d.mkdir(parents=True, exist_ok=True)
    cuda = _cuda() is not None
    check = Check(out, publish, args.budget_s, args.jobs or (4 if cuda else 2), cuda,
                  args.rehearse, args.only, environment(), render)
    doc = check.run(plan(out, args.quick))
    if publish != out:
        collect(out, publish)
    print(render(doc))
    if not cuda:
        print("no CUDA device is present: the CUDA parts were not run (exit 0)")
        return 0
    return 1 if any(p["status"] == "failed" for p in doc["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
