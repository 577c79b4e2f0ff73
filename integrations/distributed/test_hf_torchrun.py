"""Distributed acceptance (issue 9) for the transformers ``Trainer`` launched by ``torchrun``: two
real CPU processes on gloo, a real ``Trainer.train`` with ``MemWatchCallback`` on each, and a leak
planted on rank 1 only (hf_rank_trainer.py). Rank 0 must name rank 1 and its culprit, log rank 1's
series through the trainer, and find no leak of its own.
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

SCRIPT = Path(__file__).parent / "hf_rank_trainer.py"
STEPS, EPOCHS = 80, 4  # per rank, as in the script
GIB = 2**30


def _report(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / f"report-rank{rank}.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow  # two interpreters that import torch and transformers
def test_trainer_under_torchrun_rank0_names_rank1_leak(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(SCRIPT), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = _report(tmp_path, 0), _report(tmp_path, 1)

    # A real two-process Trainer run on gloo, each rank watched by its own session.
    for r, rep in enumerate((r0, r1)):
        assert rep["rank"] == r and rep["world_size"] == 2 and rep["backend"] == "gloo", rep
        assert rep["steps"] == EPOCHS * STEPS and rep["epochs"] == EPOCHS
        assert Path(rep["out_dir"]) == tmp_path / "out" / "memwatch" / f"rank{r}"
    # The bug ran on rank 1 only (64 KiB per step).
    assert r0["kept_bytes"] == 0
    assert r1["kept_bytes"] == EPOCHS * STEPS * r1["bytes_per_kept"] == EPOCHS * STEPS * 65536

    # Rank 1 judged its own memory: a leak with the holder named.
    own1 = [f for f in r1["findings"] if f["kind"] == "leak"]
    assert own1 and all(f["rank"] == 1 and f["metric"] == "host.rss" for f in own1), own1
    assert "rank1_hidden" in (own1[-1]["culprit"] or "")
    # Rank 0 is clean itself ...
    assert not [f for f in r0["findings"] if f["kind"] == "leak"], r0["findings"]
    # ... and reports rank 1's leak, carrying rank 1's culprit.
    cross = [f for f in r0["findings"] if f["kind"] == "rank_leak"]
    assert cross, r0["findings"]
    for f in cross:
        assert f["metric"] == "host.rss" and f["rank"] == 1
        assert f["evidence"]["ranks"] == [1] and f["evidence"]["only_some_ranks"] is True
        assert "only on rank(s) 1 of 2" in f["message"]
        assert f["culprit"].startswith("rank 1: ") and "rank1_hidden" in f["culprit"]
        assert f["bytes_per_step"] >= 32 * 1024  # at least half of what the bug keeps per step
    assert not [f for f in r1["findings"] if f["kind"] == "rank_leak"]  # rank 0 only

    # Through the trainer's own logging on rank 0: the finding, in time ...
    hist0 = r0["log_history"]
    leak_steps = [row["step"] for row in hist0 if row.get("memwatch/findings/rank_leak")]
    assert leak_steps and leak_steps[0] <= 3 * STEPS, leak_steps  # due by the end of epoch 2
    # ... and every rank's series at every epoch end, where rank 1's floor climbs with the leak.
    per_rank = [row for row in hist0 if "memwatch/rank1/host.rss.peak_gib" in row]
    assert [row["step"] for row in per_rank] == [STEPS * (e + 1) for e in range(EPOCHS)]
    assert all("memwatch/rank0/host.rss.peak_gib" in row and "memwatch/rank1/host.rss.floor_gib"
               in row and "memwatch/ranks/host.rss.imbalance" in row for row in per_rank)
    rise = per_rank[-1]["memwatch/rank1/host.rss.floor_gib"] \
        - per_rank[0]["memwatch/rank1/host.rss.floor_gib"]
    assert rise * GIB >= 0.5 * (EPOCHS - 1) * STEPS * 65536, rise * GIB
    assert [s["rank"] for s in r0["rank_summaries"]] == [0, 1]
    # Only rank 0 holds the summaries: rank 1's history has no per-rank keys.
    assert not any(k.startswith(("memwatch/rank", "memwatch/findings/rank_leak"))
                   for row in r1["log_history"] for k in row)

    # Warnings say which rank they come from.
    assert any(w.startswith("memwatch [rank 0]: rank_leak in host.rss")
               and "only on rank(s) 1 of 2" in w for w in r0["warnings"]), r0["warnings"]
    assert not any(": leak in" in w for w in r0["warnings"]), r0["warnings"]
    assert any(w.startswith("memwatch [rank 1]: leak in host.rss") for w in r1["warnings"])
