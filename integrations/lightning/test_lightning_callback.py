"""MemWatchCallback driven by a real Trainer.fit on CPU: logging, accumulation, eval loops,
clean runs, failures and configuration."""

from __future__ import annotations

import doctest
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from lightning_helpers import Regressor, column, loader, make_trainer, read_metrics

import memwatch
from memwatch.core import metrics as _logkeys
from memwatch.core.errors import ConfigError
from memwatch.integrations import lightning as mw_lightning
from memwatch.integrations.lightning import MemWatchCallback, MemWatchWarning


def test_csv_logger_gets_memwatch_keys_at_the_trainer_cadence(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False)
    trainer = make_trainer(tmp_path, [cb], max_epochs=2, log_every_n_steps=4)
    trainer.fit(Regressor(width=64), loader(12, 32), loader(3, 32))
    rows = read_metrics(trainer)
    keys = set(rows[0])
    for k in ("memwatch/host.rss_gib", "memwatch/host.uss_gib", "memwatch/host.pss_gib",
              "memwatch/findings/count", "memwatch/val/host.rss_gib",
              "memwatch/val/host.rss.peak_gib", "memwatch/val/findings/count"):
        assert k in keys, sorted(keys)
    rss = column(rows, "memwatch/host.rss_gib")
    # 24 optimizer steps, logged every 4th: 6 rows, at Lightning's own logging steps.
    assert len(rss) == 6
    steps = [int(r["step"]) for r in rows if r["memwatch/host.rss_gib"]]
    assert steps == [3, 7, 11, 15, 19, 23]
    # ... the same steps as the model's own per-step metric, so rows line up in every logger.
    assert steps == [int(r["step"]) for r in rows if r.get("train_loss", "") != ""]
    assert all(0.01 < v < 1024 for v in rss)  # GiB, not bytes
    # Validation is its own series: it never shows up in the training keys' rows and vice versa.
    for r in rows:
        assert not (r["memwatch/host.rss_gib"] and r["memwatch/val/host.rss_gib"])
    assert len(column(rows, "memwatch/val/host.rss_gib")) == 2  # one per validation run
    assert cb.memwatch is not None and cb.memwatch.step_count == 24
    assert cb.eval_memwatch["val"].step_count == 6  # sanity-check batches are not sampled
    assert not cb.memwatch.running  # teardown closed it


def test_one_sample_per_optimizer_step_under_gradient_accumulation(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False, analyze=False)
    trainer = make_trainer(tmp_path, [cb], max_epochs=2, accumulate_grad_batches=4,
                           limit_val_batches=0, logger=False)
    trainer.fit(Regressor(width=32), loader(10, 16))
    # 10 batches per epoch, accumulating 4: steps after batches 4, 8 and the last one (10).
    assert trainer.global_step == 6
    assert cb.memwatch is not None and cb.memwatch.step_count == 6
    assert [e.n_steps for e in cb.memwatch.epochs] == [3, 3]


def test_clean_run_is_silent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # pytest turns any warning into an error: a MemWatchWarning here fails the fit itself.
    cb = MemWatchCallback()
    trainer = make_trainer(tmp_path, [cb], max_epochs=3)
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        trainer.fit(Regressor(), loader(40), loader(4))
    assert not [r for r in caplog.records if r.name.startswith("memwatch")]
    loud = [f.to_dict() for f in cb.findings if f.severity != "info"]
    assert not loud
    assert cb.memwatch is not None and cb.memwatch.disabled == {}


def test_user_exception_propagates_unchanged_and_closes(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False)
    trainer = make_trainer(tmp_path, [cb], max_epochs=1, limit_val_batches=0)
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(Regressor(width=32, fail_at_step=3), loader(10, 16))
    assert cb.memwatch is not None and not cb.memwatch.running


def test_test_loop_has_its_own_series(tmp_path: Path) -> None:
    cb = MemWatchCallback(workers=False)
    trainer = make_trainer(tmp_path, [cb], max_epochs=1, limit_val_batches=0)
    model = Regressor(width=32)
    trainer.fit(model, loader(6, 16))
    trainer.test(model, loader(5, 16))
    assert cb.eval_memwatch["test"].step_count == 5
    rows = read_metrics(trainer)
    assert column(rows, "memwatch/test/host.rss_gib")


def test_given_memwatch_is_driven(tmp_path: Path) -> None:
    mw = memwatch.MemWatch(device="cpu", workers=False, out_dir=tmp_path / "mw")
    cb = MemWatchCallback(mw)
    trainer = make_trainer(tmp_path, [cb], max_epochs=1, limit_val_batches=0, logger=False)
    trainer.fit(Regressor(width=32), loader(5, 16))
    assert mw.step_count == 5 and len(mw.epochs) == 1 and not mw.running


class _StopAfter(memwatch.MemWatch):
    """A MemWatch whose watchdog verdict is scripted: stop once N steps were sampled."""

    stop_after = 4

    @property  # type: ignore[override]
    def should_stop(self) -> bool:
        return self.step_count >= self.stop_after

    @should_stop.setter
    def should_stop(self, value: bool) -> None:  # the real session may assign it
        pass


def test_graceful_stop_saves_a_checkpoint_and_stops(tmp_path: Path) -> None:
    mw = _StopAfter(device="cpu", workers=False, out_dir=tmp_path / "mw", analyze=False)
    cb = MemWatchCallback(mw, graceful_stop=True, log_every_n_steps=2)
    trainer = make_trainer(tmp_path, [cb], max_epochs=5, limit_val_batches=0, logger=False)
    with pytest.warns(MemWatchWarning, match="stopping training"):
        trainer.fit(Regressor(width=32), loader(10, 16))
    assert cb.stopped_by_memwatch
    assert trainer.global_step < 10
    assert list((tmp_path / "mw").glob("memwatch-stop-step*.ckpt"))


def test_graceful_stop_is_opt_in(tmp_path: Path) -> None:
    mw = _StopAfter(device="cpu", workers=False, out_dir=tmp_path / "mw", analyze=False)
    cb = MemWatchCallback(mw, log_every_n_steps=2)
    trainer = make_trainer(tmp_path, [cb], max_epochs=1, limit_val_batches=0, logger=False)
    trainer.fit(Regressor(width=32), loader(10, 16))
    assert trainer.global_step == 10 and not cb.stopped_by_memwatch


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"log_every_n_steps": 0}, "log_every_n_steps"),
        ({"interval_s": -1}, "interval_s"),
        ({"no_such_option": 1}, "no_such_option"),
        ({"memwatch": memwatch.MemWatch(device="cpu"), "interval_s": 1.0}, "interval_s"),
    ],
)
def test_bad_configuration_raises_config_error(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        MemWatchCallback(**kwargs)  # type: ignore[arg-type]


def test_missing_lightning_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['lightning'] = None\n"
        "sys.modules['lightning.pytorch'] = None\n"
        "sys.modules['pytorch_lightning'] = None\n"
        "try:\n"
        "    import memwatch.integrations.lightning\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'memwatch[lightning]'" in out.stdout, out.stderr


def test_works_with_the_pytorch_lightning_namespace(tmp_path: Path) -> None:
    pl = pytest.importorskip("pytorch_lightning")
    from torch.utils.data import DataLoader

    cb = MemWatchCallback(workers=False, analyze=False)

    class Model(pl.LightningModule):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__()
            self.inner = Regressor(width=16)

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            x, y = batch
            return ((self.inner.net(x) - y) ** 2).mean()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return self.inner.configure_optimizers()

    dl: DataLoader[object] = loader(4, 8)
    trainer = pl.Trainer(max_epochs=1, callbacks=[cb], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=str(tmp_path), accelerator="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=pl.utilities.warnings.PossibleUserWarning)
        trainer.fit(Model(), dl)
    assert cb.memwatch is not None and cb.memwatch.step_count == 4


@pytest.mark.parametrize("module", [_logkeys, mw_lightning])
def test_docstring_examples_run(module: object, tmp_path: Path) -> None:
    # conftest.py keeps src/memwatch/integrations out of --doctest-modules (optional extras);
    # their examples run here, with the framework installed.
    res = doctest.testmod(module, extraglobs={"tmp": str(tmp_path)},  # type: ignore[arg-type]
                          optionflags=doctest.ELLIPSIS)
    assert res.attempted > 0 and res.failed == 0
