"""One job spread over several out_dirs (issue 45): found wherever its nodes wrote it (several
paths, or one folder their copies were gathered into), each bundle once; a peer failure is a
consequence, never the job's first failure while a rank's own failure is known; and one HTML
report tells the job, verdict first.

The ranks are real sessions on a FakeDevice, told their rank, node and job by the launcher's
variables: rank 0 (node0) fails first but only of a peer failure, rank 1 (node0) then dies of a
device OOM, rank 2 (node1) fails of a peer failure, rank 3 (node1) leaves nothing.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import memwatch
from memwatch.cli import main
from memwatch.core.errors import BundleError
from memwatch.report.gather import MAX_DEPTH, gather, holds_output
from memwatch.report.job_report import render_job_html, series_chart
from memwatch.report.jobs import compare, group_jobs
from memwatch.testing import FakeDevice

MIB = 1 << 20
GLOO = "[third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [h]:1"


def _rank(out: Path, rank: int, node: int, fail: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        for k, v in {"RANK": rank, "LOCAL_RANK": rank % 2, "WORLD_SIZE": 4, "GROUP_RANK": node,
                     "GROUP_WORLD_SIZE": 2, "MEMWATCH_JOB_ID": "job-45",
                     "SLURMD_NODENAME": f"node{node}"}.items():
            m.setenv(k, str(v))
        dev = FakeDevice(total_bytes=256 * MIB)
        with pytest.raises((RuntimeError, MemoryError)), \
                memwatch.watch(device=dev, workers=False, out_dir=out, signals=False) as mw:
            for _ in range(30):
                dev.malloc(MIB * (1 + rank))
                mw.step()
            if fail == "oom":
                dev.malloc(1 << 40)
            raise RuntimeError(GLOO)


@pytest.fixture(scope="module")
def job_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("job")
    mp = pytest.MonkeyPatch()
    try:
        _rank(root / "node0", 0, 0, "peer", mp)  # first in time, but only a consequence
        _rank(root / "node0", 1, 0, "oom", mp)
        _rank(root / "node1", 2, 1, "peer", mp)
    finally:
        mp.undo()
    return [root / "node0", root / "node1"]


def test_gather_finds_every_out_dir_once(job_dirs: list[Path], tmp_path: Path) -> None:
    g = gather(job_dirs)
    assert g.out_dirs == job_dirs and len(g.entries) == 3
    # Copies gathered under one folder, per node and per rank, as from a shared file system:
    # found down to MAX_DEPTH levels, and a bundle read twice counts once.
    for d in job_dirs:
        shutil.copytree(d, tmp_path / "gathered" / d.name / "rank-out")
    again = gather([tmp_path / "gathered", *job_dirs])
    assert len(again.out_dirs) == 4 and [p.name for p, _ in again.entries] == \
        [p.name for p, _ in g.entries]
    deep = tmp_path / "deep"
    shutil.copytree(job_dirs[0], deep.joinpath(*["x"] * (MAX_DEPTH + 1)))
    assert gather([deep]).entries == [] and not holds_output(deep)
    flat = tmp_path / "flat"  # bundles copied into one folder, without their out_dir
    for p, _ in g.entries:
        shutil.copytree(p, flat / p.name)
    assert len(gather([flat]).entries) == 3 and holds_output(flat)
    with pytest.raises(BundleError, match="no such directory"):
        gather([tmp_path / "nope"])
    (tmp_path / "file").write_text("x")
    with pytest.raises(BundleError, match="not a directory"):
        gather([tmp_path / "file"])


def test_a_peer_failure_is_never_the_first_failure_when_a_rank_failed_of_its_own(
        job_dirs: list[Path]) -> None:
    (job,) = group_jobs(gather(job_dirs).entries)[0]
    assert job.world_size == 4 and job.ranks == [0, 1, 2] and job.missing_ranks == [3]
    assert job.hosts == ["node0", "node1"]
    first = job.first_failure()
    assert first.rank == 1 and first.classification == "cuda_oom"
    assert job.bundles[0].rank == 0 and job.bundles[0].classification == "peer_failure"
    c = compare(job)
    notes = " ".join(c.notes)
    assert "Rank(s) 0, 2 failed because their collective lost a peer" in notes
    assert "the job's own failure is rank 1's" in notes and "No bundle from rank(s) 3" in notes


def test_ls_and_inspect_when_the_rank_that_died_left_no_bundle(
        job_dirs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dirs = [tmp_path / d.name for d in job_dirs]
    for d in job_dirs:
        shutil.copytree(d, tmp_path / d.name)
    for b in (dirs[0] / "oom").iterdir():  # rank 1 killed outright: no bundle of its own
        if "-rank1-" in b.name:
            shutil.rmtree(b)
    assert main(["ls", *map(str, dirs)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.endswith("; no rank's own failure recorded, first: rank 0's collective lost a "
                         "peer (peer_failure)"), head
    assert "on 2 hosts (node0, node1)" in head and "none from rank(s) 1, 3" in head
    assert main(["inspect", *map(str, dirs)]) == 0
    out = capsys.readouterr().out
    assert "No rank's own failure was recorded; first: rank 0's collective lost a peer" in out
    assert "No bundle records a failure of a rank's own: rank(s) 0, 2" in out
    assert "the job's store named no rank" in out
    # The ranks' loops had no epochs: the first failure is told in steps only.
    assert "(step 30):" in out and "epoch" not in out, out


def test_one_html_report_of_the_job_verdict_first(job_dirs: list[Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (job,) = group_jobs(gather(job_dirs).entries)[0]
    c = compare(job)
    fig, left_out = series_chart(c, "device.allocated") or ({}, -1)
    assert left_out == 0 and [t["name"] for t in fig["data"]] == \
        ["rank 1 (node0)", "rank 2 (node1)", "rank 0 (node0)"]  # the first to fail, then peaks
    page = render_job_html(job, "node0 node1", with_charts=False)
    head = page.index("Rank 1 on node0 failed first")
    assert "(step 30): " in page[head:head + 200], page[head:head + 200]  # no epoch 0
    assert head < page.index("Every rank at") < page.index("The bundles read")
    assert "The GPU ran out of memory (CUDA OOM)" in page
    assert "failed because their collective lost a peer" in page
    out = tmp_path / "job.html"
    assert main(["report", *map(str, job_dirs), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert re.match(r"memwatch: job job-45, 3 bundle\(s\) from rank\(s\) 0, 1, 2 under ", err)
    html = out.read_text()
    assert "Rank 1 on node0 failed first" in html and html.count("class='chart'") >= 1
    assert main(["report", *map(str, job_dirs), "--job", "nope", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no job 'nope' (jobs there: job-45)" in err
