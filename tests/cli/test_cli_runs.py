"""What a finished run leaves, read by the commands: ``ls`` lists it under its own heading (and
takes no other tool's folder for a bundle), ``inspect`` and ``report`` show it when there is no
bundle; a distributed job's ranks are one finished job. The ranks ``ls`` shows are ``--json``'s."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import memwatch
from memwatch.bundle.run_summary import write_summary
from memwatch.cli import main
from memwatch.testing import FakeDevice

MIB = 1 << 20


def _run(out: Path, leak: bool = True, **options: Any) -> memwatch.MemWatch:
    dev = FakeDevice(total_bytes=256 * MIB)
    with memwatch.watch(device=dev, host=False, workers=False, out_dir=out, signals=False,
                        check_every_n_steps=100, check_every_s=None, warn=False,
                        run_report="tables", **options) as mw:
        for s in range(400):
            dev.set(allocated=(16 + (s if leak else 0) // 4) * MIB)
            mw.step()
    return mw


def test_a_finished_run_in_ls_inspect_and_report(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs" / "memwatch"
    _run(out)
    for other in ("wandb/offline-run-x/files", "lightning_logs/version_0"):  # other tools'
        (tmp_path / "runs" / other).mkdir(parents=True)
    assert main(["ls", str(tmp_path / "runs")]) == 0
    said = capsys.readouterr().out
    assert "unreadable" not in said and "wandb" not in said, said
    assert said.startswith(f"no bundles under {tmp_path / 'runs'}")
    assert "finished runs, not bundles" in said and "rank 0  400 steps, 4 checks" in said
    assert "leak in device.allocated" in said
    assert main(["ls", "--json", str(tmp_path / "runs")]) == 0
    doc = json.loads(capsys.readouterr().out)
    (run,) = doc["finished_runs"]
    assert run["steps"] == 400 and run["rank"] == 0 and run["verdict"].endswith(
        "leak in device.allocated") and doc["bundles"] == []
    assert main(["inspect", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"memwatch run in {out}") and "Report: " in said
    dest = tmp_path / "r.html"
    assert main(["report", str(out), "-o", str(dest)]) == 0
    assert dest.read_bytes() == (out / "report.html").read_bytes()
    assert "shown: the run that ended there" in capsys.readouterr().err


def test_the_ranks_of_a_finished_job_are_one_job(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    _run(out / "rank0", leak=False)
    _run(out / "rank1")
    for rank in (0, 1):  # as two ranks of one job write them (their rank, world and job id)
        p = out / f"rank{rank}" / "summary.json"
        doc = json.loads(p.read_text())
        doc.update(rank=rank, world_size=2, job={"id": "torchelastic-abc", "source": "x",
                                                  "attempt": 0})
        if rank == 0:
            doc["rank_verdicts"] = [{**doc["verdicts"][0], "kind": "rank_leak", "rank": 0,
                                     "severity": "warning"}] if doc["verdicts"] else [
                {"kind": "rank_leak", "metric": "device.allocated", "severity": "warning",
                 "message": "rank 1 grows", "holder": None, "stage": "train", "rank": 0}]
        for k in ("schema_version", "kind", "memwatch_version"):
            doc.pop(k)
        write_summary(p.parent, doc)
    assert main(["ls", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.count("finished job torchelastic-abc: world size 2") == 1, said
    assert "across ranks (rank 0): warning rank_leak in device.allocated" in said
    assert main(["inspect", str(out)]) == 0
    said = capsys.readouterr().out
    assert "Rank 0 " in said and "Rank 1 " in said and "Across ranks" in said, said
    dest = tmp_path / "job.html"
    assert main(["report", str(out), "-o", str(dest)]) == 0
    page = dest.read_text()
    assert "memwatch job torchelastic-abc" in page and "rank 1" in page
    assert "rank_leak" in page.replace("rank leak", "rank_leak")


def test_ls_shows_the_rank_its_json_shows(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                           run_report="none")
    mw.start()
    mw.step()
    path = mw.dump("a look")
    mw.close()
    assert path is not None
    assert main(["ls", "--json", str(tmp_path)]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["bundles"]
    assert entry["rank"] == 0
    assert main(["ls", str(tmp_path)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if path.name in ln)
    assert row.split()[1] == "0", row


def test_an_end_of_run_bundle_is_no_failure(tmp_path: Path) -> None:
    class WantsOne:
        wants_final_bundle = True
        got: list[Path] = []

        def on_metrics(self, step: int, sample: Any) -> None: ...

        def on_check(self, report: Any) -> None: ...

        def on_bundle(self, path: Path, manifest: Any) -> None:
            self.got.append(path)

        def close(self) -> None: ...

    sink = WantsOne()
    with memwatch.watch(device="cpu", workers=False, out_dir=tmp_path, signals=False,
                        sinks=[sink], run_report="none") as mw:
        mw.step()
    (path,) = sink.got
    assert path.parent == tmp_path / "end_of_run" and not (tmp_path / "oom").exists()
    assert main(["ls", str(tmp_path)]) == 0
    shutil.rmtree(tmp_path / "end_of_run")
