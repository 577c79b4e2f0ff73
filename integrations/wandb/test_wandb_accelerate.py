"""Accelerate with ``log_with="wandb"`` (offline) and a ``WandbSink(series=False)`` on the
tracker's run: the hook's keys go through ``accelerator.log`` (explicit steps), the sink adds
the leak chart, summary and report without moving the run's step. Read back from the run
directory."""

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
    sink = WandbSink(run=acc.get_tracker("wandb"), series=False)
    hook = attach(acc, opt, workers=False, log_every_n_steps=8, sinks=[sink])
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
    # The hook's per-step keys every 8 steps, on the loop's steps.
    rss = [r["_step"] for r in out.history if "memwatch/host.rss_gib" in r]
    assert rss == list(range(8, 145, 8)), rss
    # The sink's panels.
    leaks = [k for r in out.history for k in r if k.startswith("memwatch/leak/")]
    assert leaks, sorted({k for r in out.history for k in r})
    assert "leak in" in out.summary["memwatch/verdict"]
    snaps = [a for a in out.artifacts if a["type"] == "memory-snapshot"]
    assert len(snaps) == 1 and "report.html" in snaps[0]["files"], out.artifacts
    assert list(run_dir.glob("files/media/html/memwatch/report_*.html"))
