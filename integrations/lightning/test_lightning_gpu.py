"""On a real CUDA device (``pytest -m gpu``): the callback watches the trainer's GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning_helpers import Regressor, column, loader, make_trainer, read_metrics

from memwatch.integrations.lightning import MemWatchCallback, MemWatchWarning

pytestmark = pytest.mark.gpu


def test_gpu_leak_is_reported_on_device_memory_with_its_holder(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False)
    model = Regressor(leak_from_epoch=1)
    trainer = make_trainer(tmp_path, [cb], accelerator="gpu", devices=1, max_epochs=3,
                           log_every_n_steps=8)
    with pytest.warns(MemWatchWarning):
        trainer.fit(model, loader(48), loader(4))
    assert cb.memwatch is not None and cb.memwatch.device is not None
    assert cb.memwatch.device.kind == "cuda"
    rows = read_metrics(trainer)
    alloc = column(rows, "memwatch/device.allocated_gib")
    assert alloc and alloc[-1] > alloc[0]
    leaks = [f for f in cb.findings if f.kind == "leak" and f.metric.startswith("device.")]
    assert leaks, [f.to_dict() for f in cb.findings]
    assert any(f.culprit and "history" in f.culprit for f in leaks), [f.to_dict() for f in leaks]


def test_gpu_clean_run_is_silent(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False)
    trainer = make_trainer(tmp_path, [cb], accelerator="gpu", devices=1, max_epochs=3)
    trainer.fit(Regressor(), loader(48), loader(4))
    assert not [f.to_dict() for f in cb.findings if f.severity != "info"]
