"""PyTorch Lightning: :class:`MemWatchCallback`.

The callback only translates Lightning's events into :class:`memwatch.MemWatch` calls and writes
what memwatch found through the trainer's own loggers (CSV, TensorBoard, W&B, MLflow...). All the
judgement (is it a leak? what holds it?) lives in the core.

Works with the ``lightning`` package (``lightning.pytorch``) and, when only that is installed, with
the older ``pytorch_lightning`` package: the callback uses no namespace-specific API.

Metric keys: every key of :mod:`memwatch.core.metrics` (samples at the trainer's
``log_every_n_steps``, aligned with the model's own metrics; ``memwatch/val/...`` and
``memwatch/test/...`` for the evaluation loops; findings at every check), written through every
logger of ``trainer.loggers``; ``memwatch/findings_table`` where a logger takes tables (W&B; a
markdown table for TensorBoard) and ``memwatch/oom_bundle`` in the hyperparameters of a run that
died.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

try:  # the current package name first, the old one second: the code is the same for both
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment,unused-ignore]
    except ImportError as _e:
        raise ImportError(
            "memwatch.integrations.lightning needs PyTorch Lightning; install it with "
            "pip install 'memwatch[lightning]'"
        ) from _e

from memwatch.core.compat import override
from memwatch.core.errors import MemWatchWarning
from memwatch.integrations import _lightning_trainer as lt
from memwatch.integrations._adapter import Adapter
from memwatch.integrations._driver import Driver
from memwatch.integrations._framework import check_log_every, guarded
from memwatch.integrations._loggers import LightningLogger
from memwatch.integrations._wandb import cover_wandb
from memwatch.session import AdapterOptions, MemWatch, Unpack

if TYPE_CHECKING:  # (either package's Trainer: the callback reads what both have)
    from lightning.pytorch import LightningModule as Module
    from lightning.pytorch import Trainer

__all__ = ["MemWatchCallback", "MemWatchWarning"]


class MemWatchCallback(Adapter, Callback):
    """Watch memory during ``Trainer.fit``: per-step samples, leak verdicts, OOM bundles.

    Args:
        memwatch: a :class:`memwatch.MemWatch` to drive instead of creating one (then pass no
            other MemWatch option). It is started in ``setup`` and closed in ``teardown``.
        log_every_n_steps: log the latest sample every N optimizer steps; ``None`` uses the
            trainer's ``log_every_n_steps``.
        watch_eval: sample validation and test loops too, each in its own timeline (a leak in
            evaluation shows in its own series and findings, never mixed with training's).
        warn: emit a :class:`MemWatchWarning` once per new finding of severity ``warning`` or
            ``critical`` (once per stage, kind and metric); any other new leak verdict gets a
            one-line notice on the ``memwatch`` logger, other ``info`` findings are only logged.
        graceful_stop: when memwatch's watchdog says to stop (``mw.should_stop``: an OOM is
            forecast within its horizon, or usage is critical), save a checkpoint and set
            ``trainer.should_stop``. Off by default. Unless you pass your own ``watchdog=...``
            option (then include its ``"stop"`` action yourself), it also adds ``"stop"`` to
            the watchdog's ``on_forecast`` and ``on_critical`` actions.
        stop_checkpoint: where that checkpoint goes; default
            ``<out_dir>/memwatch-stop-step<N>.ckpt``.
        wandb_sink: when the trainer has a ``WandbLogger``, add a
            :class:`memwatch.sinks.wandb.WandbSink` on its run (charts keyed to the step, findings
            table, leak charts, summary, bundle artifacts; see ``docs/wandb.md``); the callback
            then leaves the training keys of that logger to the sink. Also pass your own with
            ``sinks=[WandbSink(...)]``.
        **memwatch_options: passed to :class:`memwatch.MemWatch` (``device``, ``out_dir``,
            ``interval_s``, ``census``...). ``device`` defaults to the trainer's root device and
            ``out_dir`` to ``<trainer.default_root_dir>/memwatch``.

    Attributes:
        findings: every finding so far (the latest 1,000), training and evaluation; evaluation
            findings carry ``evidence["stage"]`` (``"val"`` or ``"test"``).
        memwatch: the training :class:`memwatch.MemWatch` (``None`` before ``setup``).
        eval_memwatch: ``{"val": MemWatch, "test": MemWatch}`` for the loops that ran.
        bundle_path: the flight-recorder bundle written when the run died, if any.

    Example::

        >>> import lightning.pytorch as L
        >>> from lightning.pytorch.demos.boring_classes import BoringModel
        >>> from memwatch.integrations.lightning import MemWatchCallback
        >>> cb = MemWatchCallback(workers=False)
        >>> trainer = L.Trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0,
        ...                     callbacks=[cb], logger=False, enable_progress_bar=False,
        ...                     enable_checkpointing=False, enable_model_summary=False,
        ...                     default_root_dir=str(tmp))
        >>> trainer.fit(BoringModel())
        >>> cb.memwatch.step_count
        4
    """

    def __init__(
        self,
        memwatch: MemWatch | None = None,
        *,
        log_every_n_steps: int | None = None,
        watch_eval: bool = True,
        warn: bool = True,
        graceful_stop: bool = False,
        stop_checkpoint: str | os.PathLike[str] | None = None,
        wandb_sink: bool = True,
        **memwatch_options: Unpack[AdapterOptions],
    ) -> None:
        if log_every_n_steps is not None:
            check_log_every(log_every_n_steps,
                            ", or None to use the trainer's log_every_n_steps.")
        self._d = Driver("MemWatchCallback", memwatch, memwatch_options, adapter=type(self),
                         warn=warn, watch_eval=watch_eval, graceful_stop=graceful_stop)
        self.log_every_n_steps = log_every_n_steps
        self.stop_checkpoint = None if stop_checkpoint is None else os.fspath(stop_checkpoint)
        self.wandb_sink = bool(wandb_sink)
        self._every = 1
        self._last_global_step = -1

    # ------------------------------------------------------------------ hooks
    # Each hook is one line of translation; none of them may raise into the training loop.
    # @override: a hook Lightning renames is a type error, not a callback that goes quiet.
    @override
    def setup(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        self._setup(trainer, stage)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._last_global_step = trainer.global_step
        self._d.set_total_steps(lt.planned_steps(trainer), lt.epoch_steps(trainer))

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # Hot path: one property read and one comparison unless an optimizer step happened.
        gs = trainer.global_step
        if gs != self._last_global_step:  # not under gradient accumulation without a step
            self._last_global_step = gs
            self._d.step()
            if self._d.graceful_stop and (lt.logger_step(trainer) + 1) % self._every == 0:
                self._check_stop(trainer)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._d.end_epoch("train")

    @override
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        if not trainer.sanity_checking:
            self._d.eval_start("val")

    @override
    def on_validation_batch_end(self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            self._d.eval_step("val")

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        if not trainer.sanity_checking:
            self._d.end_epoch("val", epoch_end_follows=lt.epoch_end_follows(trainer))

    @override
    def on_test_epoch_start(self, trainer: Trainer, pl_module: Module) -> None:
        self._d.eval_start("test")

    @override
    def on_test_batch_end(self, trainer: Trainer, pl_module: Module, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._d.eval_step("test")

    @override
    def on_test_epoch_end(self, trainer: Trainer, pl_module: Module) -> None:
        self._d.end_epoch("test")

    @override
    def on_exception(self, trainer: Trainer, pl_module: Module, exception: BaseException) -> None:
        # Lightning calls this inside its `except` block: nothing may escape (the driver
        # never raises), and every session closes.
        self._d.handle_exception(exception)
        self._d.close()

    @override
    def teardown(self, trainer: Trainer, pl_module: Module, stage: str) -> None:
        self._d.close()

    # ------------------------------------------------------------------ translation
    def _setup(self, trainer: Trainer, stage: str) -> None:
        d = self._d
        d.configure(lt.root_device(trainer), getattr(trainer, "default_root_dir", None),
                    getattr(trainer, "world_size", 1), getattr(trainer, "global_rank", 0))
        every = self.log_every_n_steps or getattr(trainer, "log_every_n_steps", 50) or 50
        self._every = max(int(every), 1)
        covered = self._wandb_covered(trainer) or set()  # (left to memwatch's W&B sink)
        d.use_loggers([LightningLogger(lg, lambda: lt.logger_step(trainer))
                       for lg in getattr(trainer, "loggers", ()) if id(lg) not in covered])
        if stage != "fit":
            return  # validate/test: only the evaluation loop is watched, from its start hook
        # The sinks follow the trainer's logging cadence.
        if d.start(log_every_n_steps=self._every) is not None and \
                getattr(trainer, "limit_val_batches", 1) != 0:
            # The validation timeline starts now rather than at the first validation: its
            # buffers are then part of the first training epoch's floor.
            d.eval_start("val")

    @guarded("attaching the W&B sink")
    def _wandb_covered(self, trainer: Trainer) -> set[int]:
        """Add a memwatch W&B sink on the trainer's WandbLogger run; the loggers it covers get
        nothing from this callback (the sink writes memwatch's keys into their run)."""
        loggers = [lg for lg in getattr(trainer, "loggers", ())
                   if type(lg).__name__ == "WandbLogger"]
        covered = bool(loggers) and cover_wandb(self._d.sinks, loggers[0], self.wandb_sink)
        return {id(lg) for lg in loggers} if covered else set()

    @guarded("the graceful stop")
    def _check_stop(self, trainer: Trainer) -> None:
        local = self._d.wants_stop()
        if getattr(trainer, "world_size", 1) > 1:
            # At the logging cadence every rank shares: one boolean reduce, so that every rank
            # saves the (collective) checkpoint and stops together.
            local = bool(trainer.strategy.reduce_boolean_decision(local, all=False))
        if not local or self._d.stopped_by_memwatch:
            return
        path = self.stop_checkpoint or os.path.join(
            getattr(self.memwatch, "out_dir", self._d.out_dir),
            f"memwatch-stop-step{trainer.global_step}.ckpt")
        trainer.save_checkpoint(path)
        trainer.should_stop = True
        self._d.stopping(f"checkpoint saved to {path}")
