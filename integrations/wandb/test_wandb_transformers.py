"""transformers ``Trainer`` with ``report_to="wandb"`` (offline): the memwatch callback adds its
W&B sink, which writes every memwatch key into W&B's run (the trainer's W&B callback gets its
rows without them: no ``train/memwatch/...``), on the trainer's own rows. Read back from the run
directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_helpers import LeakyTrainer, Tokens, make_args, tiny_bert

from memwatch import MemWatchWarning
from memwatch.integrations.transformers import MemWatchCallback
from memwatch.sinks.wandb import WandbSink
from memwatch.testing.wandb_offline import read_offline_run

wandb = pytest.importorskip("wandb")

# The planted leak stands for one in a long run: the run says it is planned for this many
# steps, where a few hundred KiB per step can kill it (severity by consequence: in the few
# hundred steps this run really has, the same growth is information).
LONG_RUN = 10_000_000


STEPS = 40  # optimizer steps per epoch (batch 8)


@pytest.mark.fresh_process
@pytest.mark.slow  # a real framework run over several epochs
def test_planted_leak_with_report_to_wandb(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    args = make_args(tmp_path, report_to=["wandb"], logging_steps=8, run_name="memwatch-hf")
    trainer = LeakyTrainer(tiny_bert(hidden_states=True), args, train_dataset=Tokens(8 * STEPS),
                           callbacks=[cb], leak_from_epoch=1)
    with pytest.warns(MemWatchWarning):
        trainer.train()
    run = wandb.run
    (sink,) = [s for s in cb.memwatch.sinks if isinstance(s, WandbSink)]  # type: ignore[union-attr]
    assert run is not None and sink.run is run
    # The W&B callback's run, no second one.
    wcb = [c for c in trainer.callback_handler.callbacks if type(c).__name__ == "WandbCallback"]
    assert wcb and sink.found_via == "wandb.run" and wcb[0]._wandb.run is run
    run_dir = Path(run.dir).parent
    wandb.finish()
    data = read_offline_run(run_dir)

    # Per-step keys under memwatch/ (not W&B's "train/"), on the trainer's own rows.
    keys = {k for r in data.history for k in r}
    assert not [k for k in keys if k.startswith("train/memwatch")], sorted(keys)
    mine = [r for r in data.history if "memwatch/host.rss_gib" in r]
    assert mine and all("train/global_step" in r for r in mine)
    assert not [r for r in data.history if "train/global_step" not in r]
    # The findings table has the leak's row...
    table = data.summary_table("memwatch/findings_table")
    assert table is not None and any(r[2] == "leak" for r in table["data"]), table
    # ...and the panels: leak chart, summary verdict, report, end-of-run snapshot.
    leaks = [k for r in data.history for k in r if k.startswith("memwatch/leak/")]
    assert leaks, sorted({k for r in data.history for k in r})
    assert "leak in" in data.summary["memwatch/verdict"]
    assert data.summary["memwatch/findings_total"] >= 1
    snaps = [a for a in data.artifacts if a["type"] == "memory-snapshot"]
    assert len(snaps) == 1 and "report.html" in snaps[0]["files"], data.artifacts
    assert list(run_dir.glob("files/media/html/memwatch/report_*.html"))
    assert isinstance(data.summary["memwatch/findings"], int)
