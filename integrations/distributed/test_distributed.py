"""Distributed acceptance (issue 9), CPU + gloo, 2 real processes.

(1) torchrun: only rank 1 leaks -> rank 0 reports a cross-rank finding naming rank 1;
(3) rank 1 dies of a real host OOM -> its bundle exists, rank 0 is not held past the timeout;
(4) step() issues no collective (every torch.distributed collective counted in the ranks, in the
same torchrun job as (1)). A torchrun job whose rank dies of a host OOM under torchrun, its peers'
collectives failing, grouped and compared by `memwatch ls` / `inspect`: test_two_nodes.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from memwatch.testing import free_port

HERE = Path(__file__).parent
SCRIPT = HERE / "rank_loop.py"


def _env() -> dict[str, str]:
    # (The plain loop has no adapter, so memwatch emits no warnings here: findings are returned.)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    return env


def _torchrun(mode: str, out: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(SCRIPT), mode, str(out)]
    subprocess.run(cmd, check=True, timeout=240, env=_env(), cwd=out)


def _report(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / f"report-rank{rank}.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def leak_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One torchrun job: only rank 1 leaks; every collective counted on both ranks."""
    out = tmp_path_factory.mktemp("leak-job")
    _torchrun("rank1_leaks", out)
    return out


def test_only_rank1_leaks_and_rank0_names_it(leak_job: Path) -> None:
    r0, r1 = _report(leak_job, 0), _report(leak_job, 1)
    own0 = [f for fs in r0["epochs"] for f in fs if f["kind"] == "leak"]
    assert own0 == []  # rank 0 itself is clean
    assert any(f["kind"] == "leak" and f["rank"] == 1 for fs in r1["epochs"] for f in fs)
    cross = [f for fs in r0["epochs"] for f in fs if f["kind"] == "rank_leak"]
    assert cross, r0["epochs"]
    assert cross[0]["evidence"]["ranks"] == [1] and cross[0]["evidence"]["only_some_ranks"]
    assert "only on rank(s) 1 of 2" in cross[0]["message"]
    assert "keep" in (cross[0]["culprit"] or "")  # rank 1's own culprit travels to rank 0
    # per-rank series reach rank 0, and the exchange is small
    assert [s["rank"] for s in r0["rank_summaries"]] == [0, 1]
    assert r0["exchange"]["exchanges"] == 4
    assert 0 < r0["exchange"]["bytes"] < 8192


def test_no_collective_from_step(leak_job: Path) -> None:
    for rank in (0, 1):
        r = _report(leak_job, rank)
        assert "collectives_in_step" not in r
        # ... while end_epoch() did exchange: one barrier and one gather per epoch, and start()
        # one broadcast (the job id); nothing else, ever
        assert r["collectives_total"] == {"monitored_barrier": 4, "gather_object": 4,
                                          "broadcast_object_list": 1}, r["collectives_total"]


def test_rank_dying_of_oom_leaves_bundle_and_rank0_does_not_hang(tmp_path: Path) -> None:
    # Hand-started ranks: torchrun would kill rank 0 as soon as rank 1 dies.
    port = free_port()
    procs, logs = [], []
    for rank in (0, 1):
        env = _env() | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        log_path = tmp_path / f"stderr-rank{rank}.txt"
        logs.append(log_path)
        with open(log_path, "wb") as err:
            procs.append(subprocess.Popen([sys.executable, str(SCRIPT), "rank1_ooms",
                                           str(tmp_path)], env=env, cwd=tmp_path, stderr=err))
    t0 = time.monotonic()
    rc1 = procs[1].wait(timeout=240)
    rc0 = procs[0].wait(timeout=240)
    wall = time.monotonic() - t0
    err1, err0 = logs[1].read_text(errors="replace"), logs[0].read_text(errors="replace")
    assert rc1 != 0 and ("can't allocate memory" in err1 or "MemoryError" in err1), err1[-2000:]
    bundles = list((tmp_path / "rank1" / "oom").glob("*-rank1-pid*"))
    assert len(bundles) == 1 and (bundles[0] / "manifest.json").exists()
    assert rc0 == 0, err0[-2000:]
    r0 = _report(tmp_path, 0)
    # rank 0's epoch end waited at most about the timeout (5 s), and said who is missing
    assert max(r0["end_epoch_s"]) < 5 + 20
    gone = [f for fs in r0["epochs"] for f in fs if f["kind"] == "rank_unresponsive"]
    assert gone and gone[0]["evidence"]["ranks"] == [1]
    # after the exchange broke, later epoch ends have no fresh summaries (nothing stale to log),
    # while rank 1's last summary (epoch 0, before it died) is kept for ranks.json
    assert r0["rank_summaries"] == []
    assert [s["epoch"] for s in r0["rank_last_seen"]] == [1, 0]
    assert wall < 200
