"""How long writing an OOM bundle takes, how big it is, and whether it works with almost no memory.

Scenarios (each in a fresh child process, so heaps and limits do not mix):

* ``fake``: a FakeDevice CUDA OOM after N steps, with ``--objects`` extra live Python objects
  (the census walks every object the garbage collector tracks: its cost grows with the heap);
* ``host-tight``: a real torch loop under ``RLIMIT_AS`` that allocates 1 MiB tensors until the
  limit, so less than 1 MiB of address space is left when the bundle is written (only the
  recorder's own reserve is available).

Usage::

    python benchmarks/bench_bundle_write.py            # prints a table, writes nothing else
    python benchmarks/bench_bundle_write.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

FAKE = textwrap.dedent("""
    import json, sys, time
    import torch
    import memwatch
    from memwatch.testing import FakeDevice
    steps, objects, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    junk = [{"i": i} for i in range(objects)]
    tensors = [torch.ones(256) for _ in range(200)]
    dev = FakeDevice(total_bytes=8 << 30)
    mw = memwatch.MemWatch(device=dev, workers=False, out_dir=out, signals=False).start()
    for i in range(steps):
        if i % 16 == 0:
            dev.malloc(8 << 20)
        mw.step()
        if i % 1000 == 999:
            mw.end_epoch()
    t0 = time.perf_counter()
    try:
        dev.malloc(64 << 30)
    except Exception as e:
        path = mw.handle_exception(e)
    dt = time.perf_counter() - t0
    m = json.load(open(path / "manifest.json"))
    print(json.dumps({"handle_s": dt, "write_s": m["write_seconds"], "bytes": m["bytes"],
                      "files": m["files"]}))
""")

HOST_TIGHT = textwrap.dedent("""
    import json, resource, sys
    import torch
    import memwatch
    torch.set_num_threads(1)
    out = sys.argv[1]
    with open("/proc/self/status") as f:
        vmsize = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=out, signals=False).start()
    limit = vmsize + 256 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    kept = []
    try:
        while True:
            kept.append(torch.ones(2**18))  # 1 MiB each, until nothing is left
            mw.step()
    except RuntimeError as e:
        path = mw.handle_exception(e)
    if path is None:
        print(json.dumps({"ok": False}))
        sys.exit(0)
    m = json.load(open(path / "manifest.json"))
    mem = json.load(open(path / "memory.json"))
    a = mem["address_space"]
    print(json.dumps({"ok": True, "write_s": m["write_seconds"], "bytes": m["bytes"],
                      "errors": m["errors"], "headroom_bytes": a["rlimit_as"] - a["vmsize"],
                      "census_ok": "error" not in json.load(open(path / "census.json"))}))
""")


def run(code: str, *args: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "child.py"
        script.write_text(code)
        r = subprocess.run([sys.executable, str(script), *args, *([] if args else [])],
                           capture_output=True, text=True, timeout=300, cwd=d)
        line = (r.stdout.strip().splitlines() or ["{}"])[-1]
        return json.loads(line)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    results: dict[str, object] = {}
    for steps, objects in ((100, 0), (5000, 0), (5000, 1_000_000)):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            r = run(FAKE, str(steps), str(objects), out)
            r["child_s"] = time.perf_counter() - t0
        results[f"fake steps={steps} objects={objects}"] = r
    with tempfile.TemporaryDirectory() as out:
        results["host-tight"] = run(HOST_TIGHT, out)
    for name, r in results.items():
        print(f"{name:<36} " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "files"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
