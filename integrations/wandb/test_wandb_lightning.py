"""Lightning + ``WandbLogger(offline=True)``: the callback adds the W&B sink by itself, and the run
read back from its directory holds the per-step keys, the findings table with the planted leak,
the leak chart, the summary, the report and the bundle artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning_helpers import Regressor, loader, make_trainer

from memwatch import MemWatchWarning
from memwatch.integrations.lightning import MemWatchCallback
from memwatch.sinks.wandb import WandbSink
from memwatch.testing import FakeDevice
from memwatch.testing.wandb_offline import read_offline_run

wandb = pytest.importorskip("wandb")


# The planted leak stands for one in a long run: the run says it is planned for this many
# steps, where a few hundred KiB per step can kill it (severity by consequence: in the few
# hundred steps this run really has, the same growth is information).
LONG_RUN = 10_000_000


@pytest.mark.slow  # a real framework run over several epochs
@pytest.mark.fresh_process
def test_planted_leak_reaches_every_panel(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="memwatch-test", save_dir=str(tmp_path), offline=True)
    cb = MemWatchCallback(workers=False, total_steps=LONG_RUN)
    # Four epochs: a host leak verdict needs census evidence at two epoch ends after the clean
    # first epoch; the fourth gives a loaded machine's noisy RSS a second chance.
    trainer = make_trainer(tmp_path, [cb], max_epochs=4, logger=logger, log_every_n_steps=8,
                           limit_val_batches=0)
    with pytest.warns(MemWatchWarning):
        trainer.fit(Regressor(leak_from_epoch=1), loader(48))
    sinks = [s for s in cb.memwatch._sinks.sinks if isinstance(s, WandbSink)]  # type: ignore[union-attr]
    assert len(sinks) == 1 and sinks[0].found_via == "lightning"
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()
    data = read_offline_run(run_dir)
    assert len(list(tmp_path.glob("wandb/*run-*"))) == 1  # the logger's run, no second one

    # Per-step keys every 8 optimizer steps (the trainer's cadence), on the memwatch/step axis.
    steps = [s for s, _ in data.series("memwatch/host.rss_gib")]
    assert steps == list(range(8, 4 * 48 + 1, 8)), steps
    defs = {m["name"]: m for m in data.metrics}
    assert defs["memwatch/host.rss_gib"]["step_metric"] == "memwatch/step"
    # The callback left that logger to the sink: memwatch's keys are the sink's alone, on the
    # trainer's own rows (those carry trainer/global_step): no row of memwatch's own.
    mine = [r for r in data.history if any(str(k).startswith("memwatch/") for k in r)]
    assert mine and all("trainer/global_step" in r for r in mine), mine[:3]
    assert not [k for r in data.history for k in r if str(k).startswith("train/memwatch")]

    table = data.summary_table("memwatch/findings_table")
    assert table is not None
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    leaks = [r for r in rows if r["kind"] == "leak" and r["stage"] == "train"]
    assert leaks and leaks[-1]["severity"] in ("warning", "critical"), rows
    leak_metric = leaks[-1]["metric"]
    assert data.tables(f"memwatch/leak/{leak_metric}_table"), [k for r in data.history for k in r]
    assert data.summary["memwatch/verdict"].endswith(f"leak in {leak_metric}")
    assert data.summary["memwatch/peak/host.rss_gib"] > 0
    # The run had a warning: at the end, the report and snapshot as a memory-snapshot artifact.
    snaps = [a for a in data.artifacts if a["type"] == "memory-snapshot"]
    assert len(snaps) == 1 and "report.html" in snaps[0]["files"], data.artifacts
    assert list(run_dir.glob("files/media/html/memwatch/report_*.html"))


@pytest.mark.slow  # a real framework run over several epochs
@pytest.mark.fresh_process
def test_a_leak_that_is_no_threat_is_named_in_the_summary(tmp_path: Path) -> None:
    # The planted leak judged against the fit's real length: no threat (info), no warning; the
    # run's summary still names it and the end-of-run report reaches the run.
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="memwatch-test", save_dir=str(tmp_path), offline=True)
    cb = MemWatchCallback(workers=False)
    trainer = make_trainer(tmp_path, [cb], max_epochs=4, logger=logger, log_every_n_steps=8,
                           limit_val_batches=0)
    trainer.fit(Regressor(leak_from_epoch=1), loader(48))  # (a warning would fail the test)
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()
    data = read_offline_run(run_dir)
    leaks = [f for f in cb.findings if f.kind == "leak"]
    assert leaks and {f.severity for f in leaks} == {"info"}, [f.to_dict() for f in leaks]
    table = data.summary_table("memwatch/findings_table")
    assert table is not None
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    assert [r["severity"] for r in rows if r["kind"] == "leak"] == ["info"]  # one per verdict
    metric = leaks[-1].metric
    assert data.summary["memwatch/verdict"] == f"info: leak in {metric}, not a threat to this run"
    snaps = [a for a in data.artifacts if a["type"] == "memory-snapshot"]
    assert len(snaps) == 1 and "report.html" in snaps[0]["files"], data.artifacts
    assert list(run_dir.glob("files/media/html/memwatch/report_*.html"))


class OomAt(Regressor):
    """Allocates past the FakeDevice's capacity at step ``at`` (a device OOM, as on a GPU)."""

    def __init__(self, dev: FakeDevice, at: int) -> None:
        super().__init__(width=64)
        self.dev, self.at = dev, at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.dev.set(allocated=(self.global_step + 1) << 20)
        if self.global_step == self.at:
            self.dev.malloc(self.dev.total_bytes() * 2)  # type: ignore[operator]
        return super().training_step(batch, batch_idx)


def test_device_oom_bundle_becomes_an_artifact(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import WandbLogger

    dev = FakeDevice(total_bytes=1 << 30)
    logger = WandbLogger(project="memwatch-test", save_dir=str(tmp_path), offline=True)
    cb = MemWatchCallback(device=dev, host=False, workers=False, signals=False)
    trainer = make_trainer(tmp_path, [cb], max_epochs=1, logger=logger, log_every_n_steps=4,
                           limit_val_batches=0)
    with pytest.raises(torch.OutOfMemoryError):
        trainer.fit(OomAt(dev, at=10), loader(16, 8))
    assert cb.bundle_path is not None
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()
    data = read_offline_run(run_dir)
    arts = [a for a in data.artifacts if a["type"] == "memwatch-oom"]
    assert len(arts) == 1, data.artifacts
    meta = arts[0]["metadata"]
    assert meta["classification"] == "cuda_oom" and meta["trigger"] == "exception"
    assert meta["bundle"] == cb.bundle_path.name and meta["rank"] == 0
    # The peak includes the bundle's last sample (the sink itself saw steps 4 and 8 only).
    assert meta["peak_bytes"]["device.allocated"] >= 10 << 20
    assert {"report.html", "manifest.json", "exception.json"} <= set(arts[0]["files"])
    assert [s for s, _ in data.series("memwatch/device.allocated_gib")] == [4, 8]
    assert data.summary["memwatch/bundle"].endswith("(memwatch-oom)")
    assert list(run_dir.glob("files/media/html/memwatch/report_*.html"))


def test_user_sinks_see_training_only_and_close_once(tmp_path: Path) -> None:
    from memwatch.sinks import MemorySink

    sink = MemorySink()
    cb = MemWatchCallback(workers=False, sinks=[sink], total_steps=LONG_RUN)
    trainer = make_trainer(tmp_path, [cb], max_epochs=2, log_every_n_steps=4,
                           limit_val_batches=2)
    trainer.fit(Regressor(width=64), loader(16, 8), loader(2, 8))
    assert [s for s, _ in sink.metrics] == list(range(4, 33, 4))  # the trainer's cadence
    assert [e for e, _, _ in sink.epochs] == [0, 1]  # training epochs, never validation's
    assert sink.closed
    # Evaluation timelines share the fan-out: their checks reach the sink's on_check too.
    assert cb.eval_memwatch["val"].checks == 2
    assert [r.stage for r in sink.reports] == ["val", "train", "val", "train"]


def test_wandb_sink_false_leaves_the_logger_to_the_callback(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="memwatch-test", save_dir=str(tmp_path), offline=True)
    cb = MemWatchCallback(workers=False, wandb_sink=False)
    trainer = make_trainer(tmp_path, [cb], max_epochs=1, logger=logger, log_every_n_steps=4,
                           limit_val_batches=0)
    trainer.fit(Regressor(width=64), loader(16, 8))
    assert not cb.memwatch.sinks.has(WandbSink)  # type: ignore[union-attr]
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()
    data = read_offline_run(run_dir)
    rows = [r for r in data.history if "memwatch/host.rss_gib" in r]
    assert rows and all("trainer/global_step" in r and "memwatch/step" not in r for r in rows)


def test_a_wandb_sink_passed_by_the_user_is_the_only_one(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="memwatch-test", save_dir=str(tmp_path), offline=True)
    mine = WandbSink(run=logger, final_snapshot="never")
    cb = MemWatchCallback(workers=False, sinks=[mine])
    trainer = make_trainer(tmp_path, [cb], max_epochs=1, logger=logger, log_every_n_steps=4,
                           limit_val_batches=0)
    trainer.fit(Regressor(width=64), loader(16, 8))
    assert [s for s in cb.memwatch.sinks if isinstance(s, WandbSink)] == [mine]  # type: ignore
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()
    rows = [r for r in read_offline_run(run_dir).history if "memwatch/host.rss_gib" in r]
    assert [r["memwatch/step"] for r in rows] == [4, 8, 12, 16]  # once each: the sink's rows
