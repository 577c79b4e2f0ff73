"""Through ``WandbLogger(offline=True)``: memwatch keys and the findings table reach the W&B run.

(The W&B issue adds panels, summaries and artifacts; this checks what the callback itself writes
through Lightning's logger, read back from the offline run directory.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from lightning_helpers import Regressor, loader, make_trainer

from memwatch.integrations.lightning import MemWatchCallback, MemWatchWarning

wandb = pytest.importorskip("wandb")


# The planted leak stands for one in a long run: the run says it is planned for this many
# steps, where a few hundred KiB per step can kill it (severity by consequence: in the few
# hundred steps this run really has, the same growth is information).
LONG_RUN = 10_000_000


def test_findings_table_and_keys_reach_an_offline_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(project="memwatch-test", save_dir=str(tmp_path), offline=True)
    cb = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    trainer = make_trainer(tmp_path, [cb], max_epochs=4, logger=logger, log_every_n_steps=8,
                           limit_val_batches=0)
    with pytest.warns(MemWatchWarning):
        trainer.fit(Regressor(leak_from_epoch=1), loader(48))
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()

    tables = sorted(run_dir.glob("files/media/table/memwatch/findings_table_*.table.json"))
    assert tables, sorted(str(p) for p in run_dir.rglob("*"))
    rows: list[list[object]] = []
    for t in tables:
        data = json.loads(t.read_text())
        assert data["columns"][:4] == ["step", "stage", "kind", "metric"]
        rows.extend(data["data"])
    assert any(r[2] == "leak" and r[1] == "train" for r in rows), rows
    # Per-step series go into the run's history (the binary .wandb log holds their names). The
    # offline writer is a separate process that may still be flushing after finish().
    needles = (b"memwatch/host.rss_gib", b"memwatch/findings/leak")
    deadline = time.monotonic() + 20
    log = b""
    while time.monotonic() < deadline:
        log = next(run_dir.glob("*.wandb")).read_bytes()
        if all(n in log for n in needles):
            break
        time.sleep(0.2)
    assert all(n in log for n in needles), len(log)
