"""A job launched by SLURM (issue 45): two real processes started with the variables ``srun``
sets in each task of ``sbatch --nodes 2 --ntasks-per-node 1`` (no RANK / WORLD_SIZE: SLURM's
own), each writing to its own node's out_dir. Their bundles must carry SLURM's job, rank, local
rank, node rank, node count and node name, and ``memwatch ls`` / ``inspect`` over both out_dirs
must group them as one job and say which node's rank failed first. The ranks are
tests/cli/job_rank.py (a FakeDevice; no torch.distributed, so every figure comes from SLURM's
environment)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memwatch.cli import main

RANK_SCRIPT = Path(__file__).with_name("job_rank.py")
_LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID",
             "MASTER_ADDR", "MASTER_PORT", "MEMWATCH_JOB_ID")


def srun_env(procid: int) -> dict[str, str]:
    """Task ``procid`` of ``sbatch --nodes 2 --ntasks-per-node 1 --job-name train`` (job 77,
    step 0), as srun sets it on node ``gpu0<procid+1>``."""
    return {
        "SLURM_JOB_ID": "77", "SLURM_JOBID": "77", "SLURM_JOB_NAME": "train",
        "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
        "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NNODES": "2",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_NODELIST": "gpu[01-02]", "SLURM_JOB_NODELIST": "gpu[01-02]",
        "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_PROCID": str(procid), "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(procid), "SLURMD_NODENAME": f"gpu0{procid + 1}",
        "SLURM_TOPOLOGY_ADDR": f"gpu0{procid + 1}", "SLURM_GTIDS": str(procid),
        "SLURM_CPUS_ON_NODE": "1", "SLURM_SUBMIT_DIR": "/home/user/run",
    }


def _start(out: Path, mode: str, procid: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER and
           not k.startswith("SLURM")} | srun_env(procid)
    return subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(out), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def slurm_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Task 0 on gpu01 runs until SLURM's SIGTERM; task 1 on gpu02 dies of a device OOM."""
    root = tmp_path_factory.mktemp("slurm")
    r0 = _start(root / "gpu01", "run", 0)
    r1 = _start(root / "gpu02", "fail", 1)  # fails at its step 121; task 0 is ready at step 30
    assert r0.stdout is not None and r0.stdout.readline().strip() == "ready"
    _, err1 = r1.communicate(timeout=120)
    assert r1.returncode != 0 and "FakeOutOfMemoryError" in err1, err1[-2000:]
    r0.send_signal(signal.SIGTERM)  # what SLURM does to the job's other tasks
    _, err0 = r0.communicate(timeout=120)
    assert r0.returncode == -signal.SIGTERM, err0[-2000:]
    return root


def _manifest(d: Path) -> dict[str, object]:
    (b,) = (d / "oom").iterdir()
    return json.loads((b / "manifest.json").read_text())  # type: ignore[no-any-return]


def test_bundles_carry_slurms_job_rank_and_node(slurm_job: Path) -> None:
    for procid, node in ((0, "gpu01"), (1, "gpu02")):
        m = _manifest(slurm_job / node)
        assert (m["rank"], m["local_rank"], m["world_size"]) == (procid, 0, 2), m
        assert m["node"] == {"rank": procid, "count": 2, "name": node}
        assert m["job"] == {"id": "slurm-77.0", "source": "SLURM_JOB_ID", "attempt": None}
    (b1,) = (slurm_job / "gpu02" / "oom").iterdir()
    env = json.loads((b1 / "environment.json").read_text())
    assert env["env"]["SLURMD_NODENAME"] == "gpu02" and env["rank"]["node_rank"] == 1


def test_ls_and_inspect_name_the_node_that_failed_first(slurm_job: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    dirs = [str(slurm_job / "gpu01"), str(slurm_job / "gpu02")]
    assert main(["ls", *dirs]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job slurm-77.0: world size 2, 2 bundle(s) from rank(s) 0, 1 on 2 hosts "
                          "(gpu02, gpu01); rank 1 on gpu02 failed first (cuda_oom)"), out
    assert main(["inspect", str(slurm_job)]) == 0  # the folder holding both nodes' out_dirs
    out = capsys.readouterr().out
    assert "job id from SLURM_JOB_ID" in out and "Rank 1 failed first" in out
    assert "on host gpu02" in out, out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if re.match(r"\s+[01]\s+gpu0", ln)}
    assert "gpu01" in rows["0"] and "signal" in rows["0"] and "gpu02" in rows["1"], out
