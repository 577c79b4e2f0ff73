"""Distributed: every rank samples its own memory with its own MemWatch; nothing collective."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from lightning_helpers import RankOneLeaks, Regressor, loader, make_trainer

from memwatch.integrations.lightning import MemWatchCallback


class RecordingCallback(MemWatchCallback):
    """Writes what its rank saw at teardown (ddp_spawn ranks are other processes)."""

    def __init__(self, record_dir: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.record_dir = record_dir

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        mw = self.memwatch
        rec = {
            "rank": trainer.global_rank, "world_size": trainer.world_size, "pid": os.getpid(),
            "steps": None if mw is None else mw.step_count,
            "epochs": None if mw is None else len(mw.epochs),
            "out_dir": None if mw is None else mw.out_dir,
            "rss": None if mw is None else mw.latest().get("host.rss"),
        }
        super().teardown(trainer, pl_module, stage)
        path = Path(self.record_dir) / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(rec))


@pytest.mark.slow
def test_ddp_spawn_every_rank_watches_itself(tmp_path: Path) -> None:
    cb = RecordingCallback(str(tmp_path), workers=False, analyze=False)
    trainer = make_trainer(tmp_path, [cb], strategy="ddp_spawn", devices=2, max_epochs=2,
                           limit_val_batches=0, logger=False)
    trainer.fit(Regressor(width=32), loader(8, 16))
    recs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {r["world_size"] for r in recs} == {2}
    assert len({r["pid"] for r in recs}) == 2  # two processes, each with its own MemWatch
    # DistributedSampler halves the data: 8 batches -> 4 per rank per epoch.
    assert [r["steps"] for r in recs] == [8, 8] and [r["epochs"] for r in recs] == [2, 2]
    assert all(r["rss"] and r["rss"] > 0 for r in recs)
    # Each rank keeps its own output folder (bundles of rank 1 never overwrite rank 0's).
    assert recs[0]["out_dir"] != recs[1]["out_dir"]
    assert recs[1]["out_dir"].endswith("rank1")


class FindingsRecorder(MemWatchCallback):
    def __init__(self, record_dir: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.record_dir = record_dir

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        mw = self.memwatch
        rec = {"rank": trainer.global_rank,
               "findings": [f.to_dict() for f in self.findings],
               "rank_summaries": [] if mw is None else mw.rank_summaries}
        super().teardown(trainer, pl_module, stage)
        (Path(self.record_dir) / f"findings-rank{trainer.global_rank}.json").write_text(
            json.dumps(rec))


@pytest.mark.slow
def test_ddp_only_rank1_leaks_and_rank0_reports_it(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    cb = FindingsRecorder(str(tmp_path), workers=False, warn=False)
    trainer = make_trainer(tmp_path, [cb], strategy="ddp_spawn", devices=2, max_epochs=4,
                           limit_val_batches=0, logger=CSVLogger(str(tmp_path / "csv")),
                           log_every_n_steps=8)
    trainer.fit(RankOneLeaks(width=32), loader(64, 16))
    r0 = json.loads((tmp_path / "findings-rank0.json").read_text())
    r1 = json.loads((tmp_path / "findings-rank1.json").read_text())
    assert not [f for f in r0["findings"] if f["kind"] == "leak"]  # rank 0 itself is clean
    assert [f for f in r1["findings"] if f["kind"] == "leak" and f["rank"] == 1]
    cross = [f for f in r0["findings"] if f["kind"] == "rank_leak"]
    assert cross and cross[0]["evidence"]["ranks"] == [1]
    assert [s["rank"] for s in r0["rank_summaries"]] == [0, 1]
    # rank 0 logged every rank's series through the trainer's logger
    header = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "memwatch/rank1/host.rss.peak_gib" in header
