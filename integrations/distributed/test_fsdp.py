"""Sharded training (issue 45): FSDP2 (``torch.distributed.fsdp.fully_shard`` on each layer and the
root, gloo, CPU, 2 ranks under torchrun) with a tiny model and Adam, through job_loop.py.

Everything FSDP adds to a rank's memory is bounded: its parameters are DTensor shards, Adam's
state (two moments per shard) appears at the first step, and each layer's all-gathered parameters
exist only around its forward and backward. None of it is a leak: rank 0, which trains the same
sharded model without the planted leak, must have no leak verdict of its own. Rank 1 keeps each
step's hidden activation in the global list ``kept``; that leak must be found on rank 1 and named
(its holder), and rank 0's cross-rank verdict must name rank 1 and that holder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memwatch.testing import free_port

SCRIPT = Path(__file__).with_name("job_loop.py")


def _report(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / f"report-rank{rank}.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow  # two interpreters that import torch and FSDP (torch._dynamo)
def test_fsdp_no_false_leak_and_the_planted_one_named(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT),
           str(tmp_path), "--fsdp", "--leak-rank", "1", "--epochs", "4", "--steps", "40"]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r0, r1 = _report(tmp_path, 0), _report(tmp_path, 1)
    assert len(r0["epochs"]) == len(r1["epochs"]) == 4
    # No false leak: sharded parameters, Adam's state and the all-gathers are not growth held.
    own0 = [f for fs in r0["epochs"] for f in fs if f["kind"] in ("leak", "fragmentation")]
    assert own0 == [], own0
    # The planted leak: found on rank 1 and named by its holder, and nothing else leaks there.
    leaks1 = [f for fs in r1["epochs"] for f in fs if f["kind"] == "leak"]
    assert leaks1, r1["epochs"]
    assert all("job_loop.kept" in (f["culprit"] or "") for f in leaks1), \
        [f["culprit"] for f in leaks1]
    assert {f["metric"] for f in leaks1} == {"host.rss"}
    # Rank 0's verdict across ranks names rank 1 and its holder.
    cross = [f for fs in r0["epochs"] for f in fs if f["kind"] == "rank_leak"]
    assert cross and cross[-1]["evidence"]["ranks"] == [1], r0["epochs"]
    assert "only on rank(s) 1 of 2" in cross[-1]["message"]
    assert "job_loop.kept" in (cross[-1]["culprit"] or "")
