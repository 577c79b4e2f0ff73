"""Acceptance (4): with num_workers=2, DataLoader worker memory is in the logged history."""

from __future__ import annotations

from pathlib import Path

from lightning_helpers import Regressor, column, loader, make_trainer, read_metrics

from memwatch.integrations.lightning import MemWatchCallback


def test_worker_metrics_are_logged(tmp_path: Path) -> None:
    # interval_s: the background sampler discovers workers a few times per (short) epoch.
    cb = MemWatchCallback(interval_s=0.05)
    trainer = make_trainer(tmp_path, [cb], max_epochs=2, log_every_n_steps=1,
                           limit_val_batches=0)
    # 2 ms per sample, 16 per batch: each worker needs ~30 ms a batch, so they live for the epoch.
    trainer.fit(Regressor(width=64), loader(24, 16, num_workers=2, delay_s=0.002))
    rows = read_metrics(trainer)
    counts = column(rows, "memwatch/workers.count")
    # Two workers while the epoch runs (an epoch boundary of non-persistent workers can briefly
    # show the old generation still exiting next to the new one).
    assert counts.count(2.0) >= len(counts) // 2, counts
    uss = [float(r["memwatch/workers.uss_gib"]) for r in rows
           if r.get("memwatch/workers.count") == "2.0"]
    pss = [float(r["memwatch/workers.pss_gib"]) for r in rows
           if r.get("memwatch/workers.count") == "2.0"]
    # Each worker holds at least a few MiB of its own (its Python heap, the prefetched batches).
    assert uss and min(uss) > 2 * 2**20 / 2**30, uss
    assert pss and min(pss) >= min(uss)
    # The main process's own series stay separate from the workers'.
    assert column(rows, "memwatch/host.rss_gib")
