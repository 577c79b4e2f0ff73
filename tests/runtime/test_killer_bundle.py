"""Issue 41: the killer in the bundle. A rank that dies of a host OOM while gathering a list of
64 MiB tensors (or bytearrays) under an address-space limit: its bundle names what held the
memory that grew since the last check, with its holder (the list ``hog``), tensors or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memwatch.bundle import Bundle, find_bundles
from memwatch.report.summary import summarize
from memwatch.report.terminal import render_text

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="RLIMIT_AS and /proc: Linux")

MIB = 2**20

CHILD = textwrap.dedent("""
    import resource, sys
    import torch
    import memwatch

    MiB = 2**20
    kind = sys.argv[2]
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=sys.argv[1], census="always",
                           bundle_report="none").start()
    for epoch in range(2):  # two checks, each with a census: the last one is the baseline
        for step in range(10):
            loss = model(torch.randn(8, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            mw.step()
        mw.end_epoch()
    with open("/proc/self/status") as f:
        vmsize = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    limit = vmsize + 26 * 64 * MiB + 32 * MiB  # room for 26 blocks of 64 MiB, not 27
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def gather():
        hog = []
        for _ in range(64):
            hog.append(torch.empty(16 * MiB) if kind == "tensors" else bytearray(64 * MiB))
        return hog

    gather()
""")


@pytest.mark.parametrize("kind", ["tensors", "bytearrays"])
def test_a_host_oom_bundle_names_the_holder_of_what_grew(kind: str, tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(script), str(out), kind], capture_output=True,
                          text=True, timeout=180, env={**os.environ})
    assert proc.returncode == 1, proc.stderr[-3000:]
    bundles = [b for _, b in find_bundles(out / "oom") if isinstance(b, Bundle)]
    assert len(bundles) == 1, proc.stderr[-3000:]
    census = json.loads((bundles[0].path / "census.json").read_text())
    killer = census["killer"]
    first = killer["held"][0]
    assert first["holder_name"] == "hog" and first["container"] == "list", killer
    assert "gather() (child.py:" in first["holder"] and first["holder"].endswith("local hog")
    assert 25 * 64 * MIB <= first["bytes"] <= 27 * 64 * MIB, first
    assert first["count"] >= 25
    if kind == "tensors":
        assert "float32[16777216]" in first["what"] and killer["since"] is not None
    else:
        assert "bytearrays of 64.0 MiB" in first["what"] and first.get("alive_now")
    # the C allocator's in-use bytes since the last check say the same, tensors or not
    assert killer["in_use_growth_bytes"] >= 25 * 64 * MIB
    # within the bundle's bounds: a few entries, seconds of CPU
    assert len(killer["held"]) <= 6 and killer["elapsed_ms"] < 30_000
    # and memwatch inspect says it
    text = render_text(summarize(bundles[0]))
    assert "What grew since the last check" in text and "local hog" in text
