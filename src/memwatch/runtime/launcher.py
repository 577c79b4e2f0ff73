"""Who this process is in its job, from its launcher: rank, local rank, world size, node, job id.

Every launcher tells its processes who they are through the environment, and memwatch reads the
same variables the frameworks read:

* torchrun / torchelastic: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, the node's rank
  ``GROUP_RANK`` and the number of nodes ``GROUP_WORLD_SIZE``;
* SLURM (``srun``): ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``,
  ``SLURM_NNODES`` (or ``SLURM_JOB_NUM_NODES``), and the node's name ``SLURMD_NODENAME``;
* Lightning or Accelerate without either: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``NODE_RANK``.

The first variable that names a value wins, in that order: ``srun torchrun ...`` gives each
worker torchrun's ``RANK`` (``SLURM_PROCID`` there numbers the torchrun agents). SLURM's
variables are read as Lightning's ``SLURMEnvironment`` reads them, and ignored where it ignores
them: in an interactive allocation (``SLURM_JOB_NAME`` ``bash`` or ``interactive``) the processes
were not started by ``srun`` as tasks of one job. Once ``torch.distributed`` is initialised, its
rank and world size win over every variable. The node's name is SLURM's (``SLURMD_NODENAME``)
where SLURM runs the job, else the host name.

Example::

    >>> slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
    ...          "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NODEID": "1",
    ...          "SLURM_NNODES": "2", "SLURMD_NODENAME": "gpu07"}
    >>> r = rank_info(slurm, use_torch=False)
    >>> r["rank"], r["local_rank"], r["world_size"], r["node_rank"], r["nnodes"]
    (3, 1, 4, 1, 2)
    >>> node_name(slurm), job_identity(slurm)["id"]
    ('gpu07', 'slurm-4242.0')
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["JOB_ENV", "job_identity", "node_info", "node_name", "rank_info", "safe_id"]

#: Launcher variables that name one job, strongest first, with the prefix of the id they give.
JOB_ENV: tuple[tuple[str, str], ...] = (
    ("MEMWATCH_JOB_ID", ""), ("SLURM_JOB_ID", "slurm-"), ("TORCHELASTIC_RUN_ID", "torchelastic-"),
    ("LSB_JOBID", "lsf-"), ("PBS_JOBID", "pbs-"),
)

# (field, variables in order of preference)
_RANK_VARS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rank", ("RANK", "SLURM_PROCID")),
    ("local_rank", ("LOCAL_RANK", "SLURM_LOCALID")),
    ("world_size", ("WORLD_SIZE", "SLURM_NTASKS")),
    ("node_rank", ("GROUP_RANK", "SLURM_NODEID", "NODE_RANK")),
    ("nnodes", ("GROUP_WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")),
)
_DEFAULTS = {"rank": 0, "local_rank": 0, "world_size": 1, "node_rank": 0, "nnodes": 1}


def _slurm_tasks(env: Mapping[str, str]) -> bool:
    """SLURM started this process as a task of a job step (``srun``), as Lightning judges it."""
    return "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def _int(v: str | None) -> int | None:
    v = (v or "").strip()
    return int(v) if v.isdigit() else None


def rank_info(env: Mapping[str, str] | None = None, use_torch: bool = True) -> dict[str, int]:
    """``rank``, ``local_rank``, ``world_size``, ``node_rank`` and ``nnodes`` of this process.

    From ``torch.distributed`` when it is initialised (rank and world size), else from the
    launcher's variables (see the module doc); 0, 0, 1, 0, 1 when nothing says otherwise.
    """
    env = os.environ if env is None else env
    slurm = _slurm_tasks(env)
    info = dict(_DEFAULTS)
    for key, names in _RANK_VARS:
        for name in names:
            if name.startswith("SLURM_") and not slurm:
                continue
            v = _int(env.get(name))
            if v is not None:
                info[key] = v
                break
    if info["nnodes"] <= info["node_rank"]:  # a node rank without a node count
        info["nnodes"] = info["node_rank"] + 1
    dist = sys.modules.get("torch.distributed") if use_torch else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            info["rank"] = dist.get_rank()
            info["world_size"] = dist.get_world_size()
    except Exception:  # noqa: BLE001
        pass
    return info


def node_name(env: Mapping[str, str] | None = None) -> str:
    """This node's name: SLURM's (``SLURMD_NODENAME``) under SLURM, else the short host name."""
    env = os.environ if env is None else env
    name = (env.get("SLURMD_NODENAME") or "").strip()
    if not name:
        try:
            name = socket.gethostname().split(".")[0]
        except OSError:
            name = ""
    return safe_id(name)[:64] or "host"


def node_info(rank: Mapping[str, int], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"rank", "count", "name"}`` of this process's node (a bundle's ``node``, a rank's
    summary): the node's rank and the number of nodes from ``rank`` (:func:`rank_info`)."""
    return {"rank": int(rank.get("node_rank", 0)), "count": int(rank.get("nnodes", 1)),
            "name": node_name(env)}


def job_identity(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Which job this process belongs to, from the launcher's environment.

    ``{"id", "source", "attempt"}``: ``id`` is ``None`` when nothing names a job (a single process
    started by hand). ``source`` is the variable the id came from; ``"MASTER_ADDR"`` (address and
    port of the rendezvous) is the weakest, since ports are reused by later jobs. ``attempt`` is
    torchelastic's restart count (ranks of one attempt fail together). SLURM ids carry the array
    task and the step, so two ``srun`` launches in one allocation are two jobs.

    Example::

        >>> job_identity({"TORCHELASTIC_RUN_ID": "a1b2", "TORCHELASTIC_RESTART_COUNT": "1"})
        {'id': 'torchelastic-a1b2', 'source': 'TORCHELASTIC_RUN_ID', 'attempt': 1}
        >>> job_identity({"SLURM_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3", "SLURM_STEP_ID": "0"})
        {'id': 'slurm-77_3.0', 'source': 'SLURM_JOB_ID', 'attempt': None}
        >>> job_identity({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.1",
        ...               "MASTER_PORT": "29500", "WORLD_SIZE": "8"})["id"]
        'master-10.0.0.1:29500'
        >>> job_identity({})["id"] is None
        True
    """
    env = os.environ if env is None else env
    attempt_s = env.get("TORCHELASTIC_RESTART_COUNT", "")
    attempt = int(attempt_s) if attempt_s.isdigit() else None
    for var, prefix in JOB_ENV:
        val = (env.get(var) or "").strip()
        if not val or val.lower() == "none":  # torchrun's default rendezvous id is "none"
            continue
        if var == "SLURM_JOB_ID":
            if env.get("SLURM_ARRAY_TASK_ID"):
                val += f"_{env['SLURM_ARRAY_TASK_ID']}"
            if env.get("SLURM_STEP_ID"):
                val += f".{env['SLURM_STEP_ID']}"
        return {"id": safe_id(prefix + val), "source": var, "attempt": attempt}
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT") and \
            (env.get("WORLD_SIZE", "1") or "1") not in ("0", "1"):
        return {"id": safe_id(f"master-{env['MASTER_ADDR']}:{env['MASTER_PORT']}"),
                "source": "MASTER_ADDR", "attempt": attempt}
    return {"id": None, "source": None, "attempt": attempt}


def safe_id(s: str) -> str:
    """``s`` with every character but letters, digits and ``-_.:@`` replaced, at most 128."""
    return "".join(c if c.isalnum() or c in "-_.:@" else "-" for c in s)[:128]
