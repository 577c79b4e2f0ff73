"""Two nodes on one machine (issue 45): a 2-node x 2-process torchrun job (c10d rendezvous on
the loopback address, gloo, CPU), each node in its own UTS namespace (``unshare --uts``: its own
host name, ``node0`` / ``node1``) writing its own out_dir. Rank 1 leaks (a global list, ``kept``),
then dies of a real host OOM (an address-space limit). What the job leaves must tell one story:

* rank 0's cross-rank verdict names rank 1, its node and its holder;
* every rank leaves a bundle: rank 1's host OOM, and the others' collectives that lost it
  (``peer_failure``, naming rank 1 from the job's store) or the launcher's SIGTERM;
* each node's torchrun summary names its ranks' bundles (``TORCHELASTIC_ERROR_FILE``);
* ``memwatch ls / inspect / report`` given both out_dirs (or one folder of their copies) say which
  node and rank failed first and show every rank's memory at that moment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memwatch.cli import main
from memwatch.testing import free_port

pytestmark = pytest.mark.slow  # two torchrun agents and four ranks importing torch: ~25 s
SCRIPT = Path(__file__).with_name("job_loop.py")
LEAKS = 1  # the rank that leaks, then dies of a host OOM (node rank 0, local rank 1)


def _can_unshare() -> str | None:
    if not shutil.which("unshare"):
        return "no unshare(1)"
    r = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"unshare --uts refused: {r.stderr.strip()}"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    why = _can_unshare()
    if why is not None:
        pytest.skip(f"two host names on one machine need a UTS namespace ({why}; root)")
    root = tmp_path_factory.mktemp("two-nodes")
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    port = free_port()
    procs = {}
    for n in (0, 1):
        out = root / f"node{n}"
        out.mkdir()
        cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', f"node{n}",
               sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node-rank", str(n), "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
               "--local-addr", "127.0.0.1", "--max-restarts", "0", str(SCRIPT), str(out),
               "--leak-rank", str(LEAKS), "--oom-rank", str(LEAKS), "--epochs", "4",
               "--steps", "40"]
        procs[n] = subprocess.Popen(cmd, env=env, cwd=out, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
    logs = {n: p.communicate(timeout=300)[0] for n, p in procs.items()}
    bundles: dict[int, list[tuple[Path, dict[str, Any]]]] = {}
    for n in (0, 1):
        for b in sorted((root / f"node{n}" / "oom").iterdir()):
            m = json.loads((b / "manifest.json").read_text())
            bundles.setdefault(m["rank"], []).append((b, m))
    return {"root": root, "logs": logs, "rc": {n: p.returncode for n, p in procs.items()},
            "bundles": bundles}


def _first(job: dict[str, Any], rank: int) -> tuple[Path, dict[str, Any]]:
    return job["bundles"][rank][0]  # type: ignore[no-any-return]


def test_every_rank_leaves_a_bundle_and_torchrun_names_them(job: dict[str, Any]) -> None:
    logs = "\n".join(job["logs"].values())
    assert job["rc"][0] != 0 and job["rc"][1] != 0, logs[-4000:]
    assert sorted(job["bundles"]) == [0, 1, 2, 3], (sorted(job["bundles"]), logs[-4000:])
    path_failed, m = _first(job, LEAKS)
    assert m["classification"] == "host_oom" and m["trigger"] == "exception"
    node = m["node"]["name"]  # which host got node rank 0 is the rendezvous' choice
    assert m["host"] == node and node in ("node0", "node1") and m["node"]["rank"] == 0
    assert m["node"]["count"] == 2 and m["world_size"] == 4 and m["local_rank"] == 1
    other = "node1" if node == "node0" else "node0"
    assert _first(job, 0)[1]["host"] == node  # its node-mate
    assert {_first(job, r)[1]["host"] for r in (2, 3)} == {other}
    assert len({b[1]["job"]["id"] for bs in job["bundles"].values() for b in bs}) == 1
    named = 0
    for r in (0, 2, 3):
        _, mr = _first(job, r)
        assert mr["classification"] == "peer_failure" or mr["trigger"] == "signal", mr
        if mr["classification"] != "peer_failure":
            continue
        first = mr["peer"]["first"]
        if first is None:  # a rank of node 1 failing after node 0's agent (the store) exited
            assert r in (2, 3) and mr["peer"]["unreachable"], mr["peer"]
            continue
        named += 1  # the store told it who failed first
        assert (first["rank"], first["node"]["name"], first["kind"]) == (LEAKS, node, "host_oom")
    assert named >= 1 or _first(job, 0)[1]["trigger"] == "signal", job["bundles"]
    # Each node's torchrun summary names its ranks' bundles (TORCHELASTIC_ERROR_FILE).
    log = job["logs"][int(node[-1])]
    assert "Root Cause (first observed failure)" in log, log[-3000:]
    root_cause = log.split("Root Cause (first observed failure)")[1]
    assert f"rank      : {LEAKS} (local_rank: 1)" in root_cause, root_cause
    assert str(path_failed) in root_cause and "error_file: <N/A>" not in root_cause
    log_other = job["logs"][int(other[-1])]
    for r in (2, 3):
        path, mr = _first(job, r)
        if mr["classification"] == "peer_failure":
            assert str(path) in log_other, log_other[-3000:]


def test_rank0_names_the_rank_its_node_and_its_holder(job: dict[str, Any]) -> None:
    node = _first(job, LEAKS)[1]["node"]["name"]
    report = json.loads((job["root"] / node / "report-rank0.json").read_text())
    cross = [f for fs in report["epochs"] for f in fs if f["kind"] == "rank_leak"]
    assert cross, report["epochs"]
    f = cross[-1]
    assert f["evidence"]["ranks"] == [LEAKS] and f["rank"] == LEAKS
    assert f"only on rank(s) {LEAKS} of 4 (rank {LEAKS} on {node})" in f["message"], f["message"]
    assert f["culprit"].startswith(f"rank {LEAKS} on {node}: ") and "kept" in f["culprit"]
    assert f["evidence"]["nodes"] == {str(LEAKS): node}
    assert [f for fs in report["epochs"] for f in fs if f["kind"] == "leak"] == []  # rank 0's own


def _rows(out: str) -> dict[str, str]:
    return {ln.split()[0]: ln for ln in out.splitlines()
            if re.match(r"\s+[0-3]\s+node[01]\s+\d+\s", ln)}


def test_ls_inspect_report_tell_one_story(job: dict[str, Any], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    root = job["root"]
    dirs = [str(root / "node0"), str(root / "node1")]
    node = _first(job, LEAKS)[1]["node"]["name"]
    assert main(["ls", *dirs]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert re.match(r"job \S+: world size 4, \d bundle\(s\) from rank\(s\) 0, 1, 2, 3 on 2 hosts "
                    r"\(node[01], node[01]\); rank 1 on " + node + r" failed first \(host_oom\)",
                    head), out
    # The same out_dirs copied into one folder, as from a shared file system: the same story,
    # and a bundle read twice (the copy and the original) counts once.
    gathered = tmp_path / "gathered"
    for d in dirs:
        shutil.copytree(d, gathered / Path(d).name / "rank-outputs")
    assert main(["ls", str(gathered)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == head
    assert main(["ls", str(gathered), *dirs]) == 0
    assert capsys.readouterr().out.splitlines()[0] == head

    assert main(["inspect", *dirs]) == 0
    out = capsys.readouterr().out
    assert f"Rank {LEAKS} failed first, at " in out and f"on host {node}" in out, out
    assert "The host ran out of memory (host OOM)" in out
    rows = _rows(out)
    assert set(rows) == {"0", "1", "2", "3"}, out
    assert "failed first: host_oom (exception)" in rows["1"]
    for r in ("0", "2", "3"):  # every rank's memory at that moment, from its own bundle
        assert re.search(r"\d+\.\d s .*MiB", rows[r]), rows[r]
        assert "peer_failure" in rows[r] or "signal" in rows[r], rows[r]
    assert "failed because their collective lost a peer" in out
    assert "killed without a chance to write (SIGKILL)" not in out

    html_path = tmp_path / "job.html"
    assert main(["report", *dirs, "-o", str(html_path)]) == 0
    page = html_path.read_text()
    first = page.index(f"Rank {LEAKS} on {node} failed first")
    assert first < page.index("rank leak") < page.index("Every rank at")  # verdict first
    for r in range(4):
        assert f"rank {r} (node" in page  # every rank's series
    assert "kept" in page and "ranks.json" in page
