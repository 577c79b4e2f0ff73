"""Who a process is in its job, from its launcher's environment (issue 45): torchrun's node rank,
and SLURM's variables read as Lightning's ``SLURMEnvironment`` reads them (compared here with
Lightning itself on the same environments)."""

from __future__ import annotations

import pytest

from memwatch.runtime.launcher import job_identity, node_info, node_name, rank_info


def slurm_env(procid: int, ntasks: int = 4, per_node: int = 2, job: str = "4242",
              name: str = "train") -> dict[str, str]:
    """What ``srun`` sets in each task of ``sbatch --nodes N --ntasks-per-node P``."""
    nodes = ntasks // per_node
    node = procid // per_node
    return {
        "SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_JOB_NAME": name, "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
        "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_NODELIST": f"gpu[01-{nodes:02d}]", "SLURM_JOB_NODELIST": f"gpu[01-{nodes:02d}]",
        "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid % per_node),
        "SLURM_NODEID": str(node), "SLURMD_NODENAME": f"gpu{node + 1:02d}",
        "SLURM_GTIDS": ",".join(str(node * per_node + i) for i in range(per_node)),
    }


def test_slurm_task_identity() -> None:
    env = slurm_env(3)
    r = rank_info(env, use_torch=False)
    assert r == {"rank": 3, "local_rank": 1, "world_size": 4, "node_rank": 1, "nnodes": 2}
    assert node_name(env) == "gpu02"
    assert node_info(r, env) == {"rank": 1, "count": 2, "name": "gpu02"}
    assert job_identity(env) == {"id": "slurm-4242.0", "source": "SLURM_JOB_ID", "attempt": None}


def test_torchrun_wins_over_slurm_and_gives_the_node_rank() -> None:
    # `srun torchrun --nnodes 2 --nproc-per-node 2 ...`: SLURM numbers the torchrun agents (one
    # task per node); torchrun numbers the workers.
    env = slurm_env(1, ntasks=2, per_node=1) | {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc"}
    r = rank_info(env, use_torch=False)
    assert r == {"rank": 3, "local_rank": 1, "world_size": 4, "node_rank": 1, "nnodes": 2}
    assert job_identity(env)["id"] == "slurm-4242.0"  # the scheduler's job is the job


def test_interactive_allocation_is_not_a_job_of_tasks() -> None:
    # `salloc` then `srun --pty bash`: SLURM's variables describe the allocation, not this
    # process (Lightning ignores them there too).
    env = slurm_env(0, name="bash")
    assert rank_info(env, use_torch=False) == {"rank": 0, "local_rank": 0, "world_size": 1,
                                               "node_rank": 0, "nnodes": 1}
    assert node_name(env) == "gpu01"


def test_no_launcher() -> None:
    r = rank_info({}, use_torch=False)
    assert r == {"rank": 0, "local_rank": 0, "world_size": 1, "node_rank": 0, "nnodes": 1}
    assert rank_info({"NODE_RANK": "2"}, use_torch=False)["nnodes"] == 3  # at least that many


@pytest.mark.parametrize("procid", [0, 1, 2, 3])
def test_agrees_with_lightning_slurm_environment(procid: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = pytest.importorskip("lightning.fabric.plugins.environments.slurm")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
              "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    env = slurm_env(procid)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    lenv = slurm.SLURMEnvironment()
    assert slurm.SLURMEnvironment.detect()
    r = rank_info(use_torch=False)
    assert (r["rank"], r["local_rank"], r["world_size"], r["node_rank"]) == (
        lenv.global_rank(), lenv.local_rank(), lenv.world_size(), lenv.node_rank())
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")
    assert not slurm.SLURMEnvironment.detect() and rank_info(use_torch=False)["world_size"] == 1
