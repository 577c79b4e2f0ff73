"""Accelerate with ``log_with="wandb"`` (offline): the hook adds memwatch's W&B sink on the
tracker's run, which writes every memwatch key there (the series, the leak chart, the summary,
the findings table, the report) on the loop's own rows, never moving the run's step. Read back
from the run directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate_helpers import setup, train

from memwatch import MemWatchWarning
from memwatch.integrations.accelerate import attach
from memwatch.sinks.wandb import WandbSink
from memwatch.testing.wandb_offline import read_offline_run

wandb = pytest.importorskip("wandb")


@pytest.mark.slow  # a real framework run over several epochs
@pytest.mark.fresh_process
def test_planted_leak_with_log_with_wandb(tmp_path: Path) -> None:
    acc, model, opt, data = setup(n_batches=48, batch_size=128, width=2048, log_with="wandb",
                                  project_dir=str(tmp_path))
    acc.init_trackers("memwatch-accelerate-test",
                      init_kwargs={"wandb": {"dir": str(tmp_path), "mode": "offline"}})
    run = acc.get_tracker("wandb", unwrap=True)
    hook = attach(acc, opt, workers=False, log_every_n_steps=8)
    (sink,) = [s for s in hook.memwatch.sinks if isinstance(s, WandbSink)]
    with pytest.warns(MemWatchWarning, match="leak"):
        train(acc, model, opt, data, epochs=3, leak_from_epoch=1,
              after_step=lambda n: acc.log({"train/loss_seen": 1.0}, step=n))
    hook.detach()
    assert sink.found_via == "accelerate" and sink._commit() is False
    run_dir = Path(run.dir).parent
    acc.end_training()
    out = read_offline_run(run_dir)

    # The loop's own rows are all there: the sink never moved the run's step.
    assert [r["_step"] for r in out.history if "train/loss_seen" in r] == list(range(1, 145))
    # The per-step keys every 8 optimizer steps (their axis, memwatch/step), each on a row of
    # the loop's own (the loop logs with explicit steps: the row still open when the sample of
    # step n comes is the loop's row n-1); no other writer, no rank prefix.
    rss = [r for r in out.history if "memwatch/host.rss_gib" in r]
    assert [r["memwatch/step"] for r in rss] == list(range(8, 145, 8)), rss
    assert all("train/loss_seen" in r for r in rss) and len(out.history) == 144
    assert not [k for r in out.history for k in r if str(k).startswith("memwatch/rank")]
    table = out.summary_table("memwatch/findings_table")
    assert table is not None and any(r[2] == "leak" for r in table["data"])
    # The sink's panels.
    leaks = [k for r in out.history for k in r if k.startswith("memwatch/leak/")]
    assert leaks, sorted({k for r in out.history for k in r})
    assert "leak in" in out.summary["memwatch/verdict"]
    snaps = [a for a in out.artifacts if a["type"] == "memory-snapshot"]
    assert len(snaps) == 1 and "report.html" in snaps[0]["files"], out.artifacts
    assert list(run_dir.glob("files/media/html/memwatch/report_*.html"))
