"""Bundles of several ranks: `memwatch ls` groups them by job, `memwatch inspect DIR` compares the
ranks at the moment the first one failed (issue 9). The ranks here are real processes sharing one
out_dir, told their rank and job by the launcher's variables; the device is a FakeDevice. The
torchrun + gloo version (job id agreed over memwatch's own group) is in
integrations/distributed/test_distributed.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memwatch.bundle import Bundle
from memwatch.cli import main
from memwatch.report.jobs import WEAK_KEY_GAP_S, group_jobs
from memwatch.runtime.exchange import job_identity

RANK_SCRIPT = Path(__file__).with_name("job_rank.py")


def _start(out: Path, mode: str, env: dict[str, str]) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID",
                         "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "MEMWATCH_JOB_ID")}
    return subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(out), mode],
                            env=full | env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One shared out_dir: a 2-rank job (rank 1 OOMs, then the 'launcher' SIGTERMs rank 0) and a
    single-process run's bundle beside it."""
    out = tmp_path_factory.mktemp("job")
    job = {"TORCHELASTIC_RUN_ID": "a1b2c3", "TORCHELASTIC_RESTART_COUNT": "0",
           "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    r0 = _start(out, "run", job | {"RANK": "0", "LOCAL_RANK": "0"})
    assert r0.stdout is not None and r0.stdout.readline().strip() == "ready"
    single = _start(out, "fail", {})
    r1 = _start(out, "fail", job | {"RANK": "1", "LOCAL_RANK": "1"})
    _, err1 = r1.communicate(timeout=120)
    assert r1.returncode != 0 and "FakeOutOfMemoryError" in err1, err1[-2000:]
    single.communicate(timeout=120)
    r0.send_signal(signal.SIGTERM)  # what torchrun does to the survivors
    _, err0 = r0.communicate(timeout=120)
    assert r0.returncode == -signal.SIGTERM, err0[-2000:]
    return out


def _bundles(d: Path) -> dict[str, Path]:
    """rank0 / rank1 / single -> bundle path."""
    out = {}
    for p in (d / "oom").iterdir():
        m = json.loads((p / "manifest.json").read_text())
        out["single" if m["world_size"] == 1 else f"rank{m['rank']}"] = p
    return out


def test_ls_groups_the_job_and_lists_the_rest(job_dir: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    b = _bundles(job_dir)
    assert set(b) == {"rank0", "rank1", "single"}
    assert main(["ls", str(job_dir)]) == 0
    out = capsys.readouterr().out
    head, _, rest = out.partition("other bundles:")
    assert head.startswith("job torchelastic-a1b2c3: world size 2, 2 bundle(s) from rank(s) "
                           "0, 1; rank 1 failed first (cuda_oom)"), out
    assert b["rank0"].name in head and b["rank1"].name in head and b["single"].name not in head
    assert b["single"].name in rest
    # rank 1's row comes first (it failed first), then rank 0's signal bundle
    rows = [ln for ln in head.splitlines() if ln.startswith("  20")]
    assert [r.split()[1:3] for r in rows] == [["1", "exception"], ["0", "signal"]], rows

    assert main(["ls", "--json", str(job_dir)]) == 0
    doc = json.loads(capsys.readouterr().out)
    (job,) = doc["jobs"]
    assert job["id"] == "torchelastic-a1b2c3" and job["ranks"] == [0, 1]
    assert job["missing_ranks"] == [] and job["first_failure"]["rank"] == 1
    assert [e["path"] for e in doc["bundles"]] == [str(b["single"])]


def test_inspect_dir_compares_ranks_at_the_first_failure(
        job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(job_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memwatch job torchelastic-a1b2c3: world size 2, bundles from rank(s) "
                          "0, 1 (job id from TORCHELASTIC_RUN_ID)"), out
    assert "Rank 1 failed first" in out and "The GPU ran out of memory (CUDA OOM)" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if re.match(r"\s+[01]\s+\S+\s+\d+\s", ln)}
    assert set(rows) == {"0", "1"}, out
    assert "failed first: cuda_oom (exception)" in rows["1"]
    assert re.search(r"\+\d+\.\d s: signal", rows["0"])
    # Rank 0 was running when rank 1 failed: its own timeline has a sample from just before, and
    # its device memory then (150 MiB held + 4 KiB/step) is what the table shows.
    cells = rows["0"].split()
    age = float(cells[3])
    assert 0 <= age < 5, rows["0"]
    m = re.search(r"(\d+\.\d) MiB \((\d+)%\)", rows["0"])
    assert m and 150 <= float(m.group(1)) < 160 and m.group(2) == "29", rows["0"]
    # rank 1's own figures at its failure: 2 MiB per step for 121 steps
    m1 = re.search(r"(\d+\.\d) MiB \((\d+)%\)", rows["1"])
    assert m1 and float(m1.group(1)) == 242.0, rows["1"]
    assert "Leak findings of each rank" in out and "rank 1: leak on device.allocated" in out
    assert f"memwatch inspect {_bundles(job_dir)['rank1']}" in out


def test_inspect_picks_a_job_and_refuses_bad_choices(job_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "out"
    shutil.copytree(job_dir, d)
    b = _bundles(d)
    # An older job: the same two bundles under another id, an hour earlier.
    for r in ("rank0", "rank1"):
        old = b[r].with_name(b[r].name.replace("2", "1", 1))
        shutil.copytree(b[r], old)
        _edit(old, lambda m: m["job"].update(id="torchelastic-older"),
              lambda mem: mem.update(captured_at_unix=mem["captured_at_unix"] - 3600))
    assert main(["inspect", str(d)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memwatch job torchelastic-a1b2c3") and \
        "1 older job(s) under" in out and "torchelastic-older" in out
    assert main(["inspect", str(d), "--job", "torchelastic-older"]) == 0
    assert capsys.readouterr().out.startswith("memwatch job torchelastic-older")
    _bad(["inspect", str(d), "--job", "nope"], capsys,
         "no job 'nope' (jobs there: torchelastic-older, torchelastic-a1b2c3)")
    _bad(["inspect", str(b["single"]), "--job", "x"], capsys, "--job is for a directory")
    # An output folder of single-process bundles: no job to compare, its newest bundle is shown.
    only = tmp_path / "single"
    (only / "oom").mkdir(parents=True)
    older = only / "oom" / b["single"].name.replace("2", "1", 1)
    shutil.copytree(b["single"], older)
    _edit(older, lambda m: m.update(trigger="manual"))
    shutil.copytree(b["single"], only / "oom" / b["single"].name)
    assert main(["inspect", str(only)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"memwatch: 2 bundle(s) under {only}; the newest is shown")
    assert f"memwatch bundle {only / 'oom' / b['single'].name}" in out
    assert "The GPU ran out of memory (CUDA OOM)" in out
    # ... and a folder whose only entry cannot be read says so, exit 2
    broken = tmp_path / "broken"
    (broken / "oom" / ".tmp-host-1-abcd").mkdir(parents=True)
    _bad(["inspect", str(broken)], capsys, "no readable bundle and no finished run here")


def test_bundles_without_job_field_group_by_launcher_env(job_dir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """Bundles written before manifests carried `job` are grouped by the launcher variables kept
    in their environment.json."""
    d = tmp_path / "out"
    shutil.copytree(job_dir, d)
    for p in _bundles(d).values():
        _edit(p, lambda m: m.pop("job", None))
    assert main(["ls", str(d)]) == 0
    assert capsys.readouterr().out.startswith("job torchelastic-a1b2c3: world size 2")


def test_per_rank_out_dirs_are_found(job_dir: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    b = _bundles(job_dir)
    for r in ("rank0", "rank1"):
        shutil.copytree(b[r], tmp_path / r / "oom" / b[r].name)
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job torchelastic-a1b2c3") and "other bundles" not in out


def _mem_bundle(rank: int, t: float, trigger: str = "exception",
                job: str = "master-10.0.0.1:29500") -> tuple[Path, Bundle]:
    """A bundle known only by its manifest (no files: grouping reads the manifest first)."""
    m: dict[str, Any] = {"rank": rank, "world_size": 2, "created_unix": t, "host": "h",
                         "trigger": trigger,
                         "classification": "cuda_oom" if trigger == "exception" else None,
                         "job": {"id": job, "source": "MASTER_ADDR" if job.startswith("master")
                                 else "MEMWATCH_JOB_ID"}}
    p = Path(f"/nonexistent/{t}-{rank}")
    return p, Bundle(p, m)


def test_manual_bundles_are_not_called_a_failure() -> None:
    from memwatch.cli.ls import _job_heading

    jobs, _ = group_jobs([_mem_bundle(1, 1.7e9, "manual", "exp1"),
                          _mem_bundle(0, 1.7e9 + 1, "manual", "exp1")])
    assert _job_heading(jobs[0]).endswith("; no failure, first bundle: rank 1 (manual)")
    # a signal bundle is reported as the first "failure" only when nothing failed
    jobs, _ = group_jobs([_mem_bundle(1, 1.7e9, "manual", "exp1"),
                          _mem_bundle(0, 1.7e9 + 1, "signal", "exp1")])
    assert _job_heading(jobs[0]).endswith("; rank 0 failed first (signal)")


def test_weak_job_key_splits_at_long_gaps() -> None:
    """Jobs known only by MASTER_ADDR:MASTER_PORT (reused by later jobs) split at long gaps."""
    bundle = _mem_bundle
    t = 1.7e9
    entries: list[Any] = [bundle(1, t), bundle(0, t + 3), bundle(0, t + WEAK_KEY_GAP_S + 10)]
    jobs, rest = group_jobs(entries)
    assert rest == [] and [j.id for j in jobs] == ["master-10.0.0.1:29500#1",
                                                   "master-10.0.0.1:29500#2"]
    assert jobs[0].ranks == [0, 1] and jobs[1].missing_ranks == [1]
    # a strong id never splits
    for _, bb in entries:
        bb.manifest["job"] = {"id": "slurm-7", "source": "SLURM_JOB_ID"}
    jobs, _ = group_jobs(entries)
    assert len(jobs) == 1 and jobs[0].first_failure().rank == 1


def test_job_identity_sources() -> None:
    assert job_identity({"MEMWATCH_JOB_ID": "exp 42/a", "SLURM_JOB_ID": "9"})["id"] == "exp-42-a"
    assert job_identity({"SLURM_JOB_ID": "9", "TORCHELASTIC_RUN_ID": "x"})["source"] == \
        "SLURM_JOB_ID"
    assert job_identity({"TORCHELASTIC_RUN_ID": "none"})["id"] is None
    assert job_identity({"MASTER_ADDR": "a", "MASTER_PORT": "1", "WORLD_SIZE": "1"})["id"] is None


# ---------------------------------------------------------------- helpers
def _edit(b: Path, manifest: Any, memory: Any = None) -> None:
    m = json.loads((b / "manifest.json").read_text())
    manifest(m)
    if memory is not None:
        mem = json.loads((b / "memory.json").read_text())
        memory(mem)
        (b / "memory.json").write_text(json.dumps(mem))
        m["files"]["memory.json"] = (b / "memory.json").stat().st_size
    (b / "manifest.json").write_text(json.dumps(m))


def _bad(args: list[str], capsys: pytest.CaptureFixture[str], expect: str) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and expect in lines[0], err
