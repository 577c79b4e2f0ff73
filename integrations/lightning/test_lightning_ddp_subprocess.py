"""Lightning ``strategy="ddp"`` (the subprocess-script launcher), not ``ddp_spawn``.

Lightning's ``ddp`` launcher re-runs the script's own command line for ranks > 0, so the training
runs in ``ddp_script.py``, started here as ``python ddp_script.py OUT_DIR``: that process is
rank 0 and Lightning starts rank 1 from it. Only rank 1 leaks. Each rank writes what it saw at
teardown (``OUT_DIR/rank<N>.json``) and a bundle on demand into its own ``out_dir``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memwatch.cli import main as memwatch_cli

SCRIPT = Path(__file__).resolve().parent / "ddp_script.py"

# Variables that would make Lightning think it is already a launched child (LOCAL_RANK), pick a
# cluster environment other than its own (SLURM, LSF, torchelastic), or give memwatch a job id
# from a launcher: the script must start as a plain `python script.py` would.
_LAUNCHER_VARS = ("LOCAL_RANK", "RANK", "GROUP_RANK", "NODE_RANK", "WORLD_SIZE",
                  "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MEMWATCH_JOB_ID",
                  "PL_GLOBAL_SEED")
_LAUNCHER_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LSB_", "LSF_", "PBS_", "JSM_", "OMPI_")


def _plain_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_VARS and not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _run_script(out: Path, timeout_s: float = 240.0) -> tuple[int, str, int]:
    """(exit status, output, pid) of ``python ddp_script.py OUT``."""
    # Own session: on a timeout, the launcher (rank 0) and the rank it started are killed together.
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(out)], env=_plain_env(),
                            cwd=str(out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        pytest.fail(f"ddp_script.py did not finish in {timeout_s:.0f} s:\n{stdout[-4000:]}")
    return proc.returncode, stdout, proc.pid


@pytest.mark.slow  # two interpreters that import torch and Lightning, 4 epochs each
def test_ddp_subprocess_launcher_rank1_leaks_rank0_reports_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, output, pid = _run_script(tmp_path)
    assert rc == 0, output[-6000:]

    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    # Lightning's subprocess launcher, really: rank 0 is the process started here, and rank 1 is
    # its child, running the same script with the same arguments and LOCAL_RANK=1.
    assert r0["launcher"] == r1["launcher"] == "_SubprocessScriptLauncher"
    assert r0["pid"] == pid and r1["pid"] != pid
    assert r1["ppid"] == pid
    assert r0["argv"] == r1["argv"] == [str(SCRIPT), str(tmp_path)]
    assert (r0["rank"], r0["local_rank"], r1["rank"], r1["local_rank"]) == (0, 0, 1, 1)
    assert r1["env_local_rank"] == "1"
    assert r0["world_size"] == r1["world_size"] == 2
    # DistributedSampler halves 64 batches: 32 steps per rank per epoch, 4 epochs.
    assert r0["steps"] == r1["steps"] == 128

    # Each rank judged its own memory: only rank 1 leaks.
    assert not [f for f in r0["findings"] if f["kind"] == "leak"], r0["findings"]
    assert [f for f in r1["findings"] if f["kind"] == "leak" and f["rank"] == 1], r1["findings"]
    # Rank 0 got rank 1's summary at the epoch-end exchange and named it.
    cross = [f for f in r0["findings"] if f["kind"] == "rank_leak"]
    assert cross, r0["findings"]
    assert cross[0]["evidence"]["ranks"] == [1]
    assert "only on rank(s) 1 of 2" in cross[0]["message"]
    assert not [f for f in r1["findings"] if f["kind"].startswith("rank_")]  # rank 0's job only
    assert [s["rank"] for s in r0["rank_summaries"]] == [0, 1]
    assert r1["rank_summaries"] == []
    # The warnings say which rank they come from.
    assert any(w.startswith("memwatch [rank 1]: leak in host.rss") for w in r1["memwatch_warnings"])
    assert any(w.startswith("memwatch [rank 0]: rank_leak in host.rss")
               for w in r0["memwatch_warnings"])
    assert not any(": leak in" in w for w in r0["memwatch_warnings"]), r0["memwatch_warnings"]

    # Rank 0 logged every rank's series through the trainer's logger (the CSV is rank 0's).
    header = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "memwatch/rank1/host.rss.peak_gib" in header.split(",")
    assert "memwatch/rank0/host.rss.peak_gib" in header.split(",")

    # One job: no launcher id under the subprocess launcher, so rank 0 made one up and sent it.
    assert r0["job"]["source"] == r1["job"]["source"] == "rank0"
    assert r0["job"]["id"] and r0["job"]["id"] == r1["job"]["id"]

    # Per-rank output folders and bundles, grouped as one job by `memwatch ls`.
    for r, rec in enumerate((r0, r1)):
        assert Path(rec["out_dir"]) == tmp_path / "memwatch" / f"rank{r}"
        assert Path(rec["bundle"]).parent == Path(rec["out_dir"]) / "oom"
        manifest = json.loads((Path(rec["bundle"]) / "manifest.json").read_text())
        assert manifest["job"]["id"] == r0["job"]["id"]
    assert (Path(r0["bundle"]) / "ranks.json").is_file()  # rank 0's view of every rank
    capsys.readouterr()
    assert memwatch_cli(["ls", "--json", str(tmp_path / "memwatch")]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [(j["id"], j["world_size"], j["ranks"]) for j in listing["jobs"]] == [
        (r0["job"]["id"], 2, [0, 1])]
    assert listing["bundles"] == []
