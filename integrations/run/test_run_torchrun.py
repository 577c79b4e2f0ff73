"""``memwatch run -- torchrun --nproc-per-node 2 ...``: every rank of a DDP (gloo, CPU) loop that
knows nothing of memwatch is watched, each in its own folder; the launcher is not. Rank 1 leaks:
it names the holder, and rank 0 reports that only rank 1 leaks (the ranks exchange a summary at
each step-based check). The clean twin is quiet on both ranks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from run_helpers import FAST, PY, Spec, assert_leak_found, run_together, script

from memwatch.cli import main as cli
from memwatch.testing import free_port


@pytest.fixture
def torchrun() -> str:
    path = shutil.which("torchrun", path=str(Path(PY).parent)) or shutil.which("torchrun")
    assert path, "torchrun comes with torch"
    return path


def test_every_rank_is_watched_and_only_rank1_leaks(tmp_path, torchrun: str, capsys) -> None:
    train = script("train_ddp.py")
    def cmd(*args: str) -> list[str]:
        return [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(free_port()), train, "--steps", "128", *args]

    opts = (*FAST, "--out-dir", "out")
    runs = run_together(tmp_path, Spec("clean", cmd(), opts),
                        Spec("leak", cmd("--leak-rank", "1"), opts))
    clean, leak = runs["clean"], runs["leak"]
    assert clean.out == leak.out and "trained 128 steps on 2 ranks" in leak.out, leak.explain()
    assert_leak_found(leak, "train_ddp.kept (list", label=" [rank 1]")
    cross = [ln for ln in leak.verdicts() if ln.startswith("memwatch [rank 0]:")
             and "rank_leak in host." in ln and "rank 1: train_ddp.kept" in ln]
    assert cross, leak.explain()
    assert not any("leak in host." in ln and "rank_leak" not in ln
                   for ln in leak.verdicts() if ln.startswith("memwatch [rank 0]:")), \
        leak.explain()
    # Rank 0's own memory is flat: the cross-rank verdict is weighed at each exchange, never
    # withdrawn by rank 0's own series ("RSS stopped growing ... withdrawn", 2026-11-28).
    assert not any("stopped growing" in ln or "withdrawn" in ln
                   for ln in leak.memwatch_lines()), leak.explain()
    assert clean.rc == 0 and clean.verdicts() == [], clean.explain()
    for r in (clean, leak):
        summaries = [ln for ln in r.memwatch_lines() if "watched the plain loop" in ln]
        assert len(summaries) == 2, r.explain()  # one per rank, none from the launcher
        for rank in (0, 1):
            assert (r.cwd / "out" / f"rank{rank}" / "report.html").is_file()
    assert sum("no leak, no warning" in ln for ln in clean.memwatch_lines()) == 2
    # The finished job's out_dir, without a bundle: one job in ls, inspect and report.
    out = leak.cwd / "out"
    capsys.readouterr()
    assert cli(["ls", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.count("finished job ") == 1 and "summaries from rank(s) 0, 1" in said, said
    assert "across ranks (rank 0): warning rank_leak in host." in said.replace(
        "critical", "warning"), said
    assert cli(["inspect", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("memwatch job ") and "Rank 0 " in said and "Rank 1 " in said, said
    assert "held by train_ddp.kept" in said and "rank_leak in host." in said, said
    html = tmp_path / "job.html"
    assert cli(["report", str(out), "-o", str(html)]) == 0
    page = html.read_text()
    assert "shown: finished job" in capsys.readouterr().err
    assert page.count("class='card ") >= 2 and "rank 1" in page, page[:2000]
