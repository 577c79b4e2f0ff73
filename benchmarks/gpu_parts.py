"""The parts of ``make gpu-check`` that need a real CUDA device (issue 18, 2c-2i), each run in a
child process of its own (``python benchmarks/gpu_parts.py PART OUT_JSON``) so that an OOM or a
CUDA error in one never poisons the next. ``gpu_check.py`` runs them and reads their JSON.

Without CUDA, the parts whose logic runs on :class:`memwatch.testing.FakeDevice` are covered by
``tests/probes/test_gpu_paths.py`` (run by gpu_check as ``fake_device_paths``); the rest report
``not run: no CUDA device``. Nothing here imports wandb or plotly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from gpu_common import EXPANDABLE, spawn, write_result  # noqa: E402

MiB = 1 << 20

#: part -> (what it checks, its time box in seconds: the child is killed after it)
PARTS: dict[str, tuple[str, int]] = {
    "2c_step_time_ratio": ("bf16 GPT-2-small plain loop: step time with/without mw.step(), "
                           "alternating blocks; synchronisations counted", 60),
    "2d_real_oom": ("a real CUDA OOM inside watch(): bundle before unwind, snapshot, census", 60),
    "2d_real_oom_expandable": ("the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                               60),
    "2e_leak_with_allocation_site": ("device tensors kept by a global list: holder and "
                                     "allocation site (record_history=True)", 90),
    "2f_stable_holes": ("interleaved allocations of 3-15 MiB: the cache settles with holes in "
                        "the first epoch and stays: no fragmentation verdict, no leak", 90),
    "2f_stable_holes_expandable": ("the same loop with expandable segments: quiet", 90),
    "2g_outside_allocator": ("device.outside_allocator read, grows with new cuBLAS handles", 45),
    "2h_private_pools": ("a CUDA graph's private pool in device.private_pools, no false leak",
                         90),
    "2i_report_of_gpu_bundle": ("memwatch report and inspect of the 2d bundle", 60),
}


def run_part(name: str, out_dir: Path, timeout: int) -> dict[str, Any]:
    """Run one part in a child process, killed after ``timeout`` seconds; its JSON result (or
    why there is none)."""
    what = PARTS[name][0]
    res = out_dir / f"{name}.json"
    env = EXPANDABLE if name.endswith("_expandable") else {}
    return spawn([__file__, name, str(res), str(out_dir)], res, what, timeout, env)


# --------------------------------------------------------------------------- the children

def _findings(mw: Any) -> list[dict[str, Any]]:
    return [f.to_dict() for f in mw.findings]


def p_2c(out: Path) -> dict[str, Any]:
    import torch
    from gpu_common import BLOCK, SIZES, SyncCounter, gpt2, ratio_summary

    import memwatch

    sz = SIZES["cuda"]  # the model the adapters' ratios train (gpu_adapters.py)
    model = gpt2(sz).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, sz["vocab"], (sz["batch"], sz["seq"]), device="cuda")

    def step() -> None:
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    times: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
            device="cuda", workers=False, out_dir=tmp, signals=False) as mw:
        for block in range(24):  # off, on, on, off, ...: drift falls on both alike
            mode = ("off", "on", "on", "off")[block % 4]
            torch.cuda.synchronize()  # the device is synchronised at block ends only
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                step()
                if mode == "on":
                    mw.step()
            torch.cuda.synchronize()
            times[mode].append((time.perf_counter() - t0) / BLOCK)
        with SyncCounter() as counter:
            for _ in range(2 * BLOCK):
                step()
                mw.step()
            mw.end_epoch()
    doc = ratio_summary(times["on"], times["off"])
    syncs = counter.result()
    failed = doc["above_limit"] or syncs["syncs_memwatch"] > 0
    return {"status": "failed" if failed else "passed", **doc, "syncs": syncs,
            "model": "GPT-2 from a config, {n_layer} layers, {n_embd} wide, seq {seq}, "
                     "batch {batch}, bf16 weights, AdamW".format(**sz)}


def _oom(out: Path, tag: str) -> dict[str, Any]:
    import torch

    import memwatch
    from memwatch.bundle import find_bundles, open_bundle
    from memwatch.bundle.format import dir_size

    free, total = torch.cuda.mem_get_info()
    d = out / f"oom-{tag}"
    held: list[Any] = []
    try:
        with memwatch.watch(device="cuda", workers=False, out_dir=d, signals=False) as mw:
            mw.step()
            held.extend(torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
                        for _ in range(8))
            torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        bundle = getattr(e, "memwatch_bundle", None)
    else:
        return {"status": "failed", "error": "no OutOfMemoryError"}
    held.clear()
    torch.cuda.empty_cache()
    paths = [p for p, b in find_bundles(d / "oom") if not isinstance(b, Exception)]
    if not paths:
        return {"status": "failed", "error": "no bundle written"}
    b = open_bundle(paths[0])
    m = b.manifest
    snap = b.snapshot() or {}
    census = b.read_json("census.json")
    cuda_groups = [g for g in census.get("groups", []) if str(g["device"]).startswith("cuda")]
    ok = m.get("pre_unwind") is True and bool(snap.get("segments")) and bool(cuda_groups)
    return {"status": "passed" if ok else "failed", "bundle": str(paths[0]),
            "bundle_bytes": dir_size(paths[0]), "exception_attr": bundle is not None,
            "pre_unwind": m.get("pre_unwind"),
            "classification": m.get("classification"), "segments": len(snap.get("segments", [])),
            "census_cuda_groups": len(cuda_groups), "write_seconds": m.get("write_seconds"),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}


kept_on_gpu: list[Any] = []


def p_2e(out: Path) -> dict[str, Any]:
    import torch

    import memwatch

    model = torch.nn.Linear(256, 256).cuda()
    with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
            device="cuda", workers=False, out_dir=tmp, signals=False,
            record_history=True) as mw:
        for _epoch in range(4):
            for _ in range(100):
                y = model(torch.randn(64, 256, device="cuda"))
                kept_on_gpu.append(torch.empty(MiB // 4, device="cuda"))  # the leak, 1 MiB
                y.sum().backward()
                mw.step()
            mw.end_epoch()
        fs = [f for f in _findings(mw) if f["kind"] == "leak"
              and f["metric"].startswith("device.")]
    culprit = fs[0]["culprit"] if fs else ""
    ok = bool(fs) and "kept_on_gpu" in culprit and "allocated at gpu_parts.py" in culprit
    return {"status": "passed" if ok else "failed", "culprit": culprit,
            "alloc_sites": fs[0]["evidence"].get("alloc_sites") if fs else None}


STEP_S = 0.002  # what the fragmenting loop's forward and backward would take, at least


def _fragment(out: Path) -> dict[str, Any]:
    """Allocations of 3-15 MiB, 24 alive, every other old one freed: holes of varying size, 2 ms
    a step (the compute the loop leaves out: the device counters are read at most every 10 ms,
    probes/cuda.py). The real allocator settles it in the first epoch (H200, 2026-11-27:
    allocated 3 -> 200 MiB and the gap 10 -> 130 MiB in epoch 0, then both flat; 292 MiB
    reserved for a 254 MiB peak, no retry, also with 1 GiB of the device left): not
    fragmentation, and memwatch must stay quiet."""
    import torch

    import memwatch
    from memwatch.probes.cuda import CudaProbe

    # GPU_CHECK_STEP_S / GPU_CHECK_NO_GATE: the same loop another way, to trace a verdict
    step_s = float(os.environ.get("GPU_CHECK_STEP_S", STEP_S))
    if os.environ.get("GPU_CHECK_NO_GATE"):
        CudaProbe.fast_min_interval_s = 0.0
    stats = torch._C._cuda_memoryStats
    trace: list[tuple[float, ...]] = []  # per step, read apart from memwatch: to replay on CPU
    sizes = [(3 + (i * 7) % 13) * MiB for i in range(64)]
    live: list[Any] = []
    oom = None
    with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
            device="cuda", workers=False, out_dir=tmp, signals=False) as mw:
        try:
            for epoch in range(4):
                for i in range(100):
                    live.append(torch.empty(sizes[(i + epoch) % 64], dtype=torch.uint8,
                                            device="cuda"))
                    if len(live) > 24:  # free every other old block: holes of varying size
                        del live[0:24:2]
                    if step_s:
                        time.sleep(step_s)
                    st = stats(0)
                    trace.append((st["allocated_bytes"]["all"]["current"],
                                  st["reserved_bytes"]["all"]["current"],
                                  st["inactive_split_bytes"]["all"]["current"],
                                  st["num_alloc_retries"]))
                    mw.step()
                mw.end_epoch()
        except torch.OutOfMemoryError as e:  # fragmentation can end it: that is a result too
            oom = str(e)[:300]
        frag = [f for f in _findings(mw) if f["kind"] == "fragmentation"]
        leaks = [f for f in _findings(mw) if f["kind"] == "leak"]
    expandable = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    retries = trace[-1][3] if trace else 0
    ok = not frag and not leaks
    return {"status": "passed" if ok else "failed", "expandable_segments": expandable,
            "fragmentation_findings": len(frag), "leaks": len(leaks), "step_s": step_s,
            "gate_s": CudaProbe.fast_min_interval_s, "alloc_retries": retries, "oom": oom,
            "findings": [f["message"] for f in frag + leaks],
            "advice": frag[0]["suggestions"] if frag else None, "trace": trace}


def p_2g(out: Path) -> dict[str, Any]:
    import torch

    import memwatch

    with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
            device="cuda", workers=False, out_dir=tmp, signals=False) as mw:
        a = torch.randn(512, 512, device="cuda")
        streams = []
        for _ in range(30):
            mw.step()
        first = mw.latest().get("device.outside_allocator")
        for _ in range(8):  # each new stream's first matmul gets a cuBLAS workspace
            s = torch.cuda.Stream()
            streams.append(s)
            with torch.cuda.stream(s):
                a @ a
        torch.cuda.synchronize()
        for _ in range(30):
            mw.step()
        time.sleep(2.5)  # a background read
        mw.step()
        last = mw.latest().get("device.outside_allocator")
        source = mw.device.describe().get("outside_allocator_source") if mw.device else None
    ok = first is not None and last is not None and first > 0
    return {"status": "passed" if ok else "failed", "first_bytes": first, "last_bytes": last,
            "source": source}


def p_2h(out: Path) -> dict[str, Any]:
    import torch

    import memwatch

    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512)).cuda()
    static_x = torch.randn(64, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = model(static_x)
    with tempfile.TemporaryDirectory() as tmp, memwatch.watch(
            device="cuda", workers=False, out_dir=tmp, signals=False) as mw:
        for _epoch in range(4):
            for _ in range(100):
                static_x.copy_(torch.randn(64, 512, device="cuda"))
                g.replay()
                static_y.sum().item()
                mw.step()
            mw.end_epoch()
        time.sleep(2.5)
        mw.step()
        pools = mw.latest().get("device.private_pools")
        source = mw.device.describe().get("private_pools_source") if mw.device else None
        bad = [f for f in _findings(mw) if f["kind"] in ("leak", "fragmentation")]
    measured = source == "memory_stats"
    ok = (bool(pools) if measured else pools != pools) and not bad  # NaN: not measured
    return {"status": "passed" if ok else "failed", "private_pools_bytes": pools,
            "source": source, "false_findings": bad,
            "note": None if measured else "this torch has no per-pool counter: the pool is "
                                          "reported not measured (NaN), and no false verdict"}


def p_2i(out: Path) -> dict[str, Any]:
    from memwatch.bundle import find_bundles

    paths = [p for p, b in find_bundles(out / "oom-plain" / "oom")
             if not isinstance(b, Exception)]
    if not paths:
        return {"status": "not run", "reason": "no bundle from 2d_real_oom"}
    cli = [sys.executable, "-m", "memwatch"]
    html = out / "gpu-bundle-report.html"
    r1 = subprocess.run([*cli, "report", str(paths[0]), "-o", str(html)], capture_output=True,
                        text=True, timeout=100)
    r2 = subprocess.run([*cli, "inspect", str(paths[0]), "--format", "plain"],
                        capture_output=True, text=True, timeout=100)
    text = html.read_text() if html.exists() else ""
    ok = r1.returncode == 0 and r2.returncode == 0 and "segment" in (r2.stdout + text).lower()
    return {"status": "passed" if ok else "failed", "report_exit": r1.returncode,
            "inspect_exit": r2.returncode, "inspect_head": r2.stdout[:1500],
            "report_bytes": len(text)}


CHILDREN = {
    "2c_step_time_ratio": p_2c,
    "2d_real_oom": lambda out: _oom(out, "plain"),
    "2d_real_oom_expandable": lambda out: _oom(out, "expandable"),
    "2e_leak_with_allocation_site": p_2e,
    "2f_stable_holes": _fragment,
    "2f_stable_holes_expandable": _fragment,
    "2g_outside_allocator": p_2g,
    "2h_private_pools": p_2h,
    "2i_report_of_gpu_bundle": p_2i,
}


def main(argv: list[str]) -> int:
    name, res, out = argv[0], Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)

    def check() -> dict[str, Any]:
        import torch

        if not torch.cuda.is_available():  # a rehearsal: the child started and answers
            return {"status": "not run", "reason": "no CUDA device (rehearsal)"}
        return CHILDREN[name](out)

    return write_result(res, check)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
