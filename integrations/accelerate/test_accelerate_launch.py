"""Acceptance (3): ``accelerate launch --num_processes 2`` on CPU (gloo): memwatch samples on both
processes, each in its own ``rank<N>`` folder, and only the main process logs.

In Accelerate 1.15 ``accelerate launch --cpu`` always starts a single process (its "simple"
launcher); two CPU processes come from the torch.distributed launcher, which ``--multi_gpu``
selects, while the script's ``Accelerator(cpu=True)`` makes each process run MULTI_CPU on gloo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memwatch.testing import free_port

SCRIPT = Path(__file__).resolve().parent / "launch_script.py"


@pytest.mark.slow  # two interpreters that import torch and accelerate
def test_accelerate_launch_two_cpu_processes(tmp_path: Path) -> None:
    launcher = Path(sys.executable).with_name("accelerate")
    assert launcher.exists(), launcher
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1")
    cmd = [str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(SCRIPT), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    results = [json.loads((tmp_path / f"result-rank{r}.json").read_text()) for r in (0, 1)]
    for r, res in enumerate(results):
        assert res["rank"] == r and res["world_size"] == 2 and res["backend"] == "gloo", res
        # 256 samples, batch 16, 2 shards: 8 optimizer steps per epoch on each process.
        assert res["steps"] == 16 and res["epochs"] == 2, res
        assert res["rss"] and res["rss"] > 0
        assert Path(res["out_dir"]) == tmp_path / "memwatch" / f"rank{r}"
        assert res["memwatch_warnings"] == [], res["memwatch_warnings"]
    assert results[0]["is_main"] and not results[1]["is_main"]
    assert results[0]["trackers"] == 1 and results[1]["trackers"] == 0

    assert not (tmp_path / "tracker-rank1.jsonl").exists()  # the other process never logged
    rows = [json.loads(line) for line in
            (tmp_path / "tracker-rank0.jsonl").read_text().splitlines()]
    samples = [r for r in rows if "memwatch/host.rss_gib" in r["values"]]
    assert [r["step"] for r in samples] == list(range(2, 17, 2))
    assert [r["step"] for r in rows if "memwatch/findings/count" in r["values"]] == [8, 16]
    # the epoch-end exchange gave the main process every rank's figures, logged per rank
    per_rank = [r for r in rows if "memwatch/rank1/host.rss.peak_gib" in r["values"]]
    assert [r["step"] for r in per_rank] == [8, 16]
    assert all("memwatch/rank0/host.rss.peak_gib" in r["values"] for r in per_rank)
