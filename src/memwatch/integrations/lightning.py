"""PyTorch Lightning: :class:`MemWatchCallback`.

The callback only translates Lightning's events into :class:`memwatch.MemWatch` calls and writes
what memwatch found through the trainer's own loggers (CSV, TensorBoard, W&B, MLflow...). All the
judgement (is it a leak? what holds it?) lives in the core.

Works with the ``lightning`` package (``lightning.pytorch``) and, when only that is installed, with
the older ``pytorch_lightning`` package: the callback uses no namespace-specific API.

Metric keys it logs (see :mod:`memwatch.core.metrics` for the full rules):

==================================================  ==============================================
key                                                 meaning
==================================================  ==============================================
``memwatch/host.rss_gib``                           this process's resident memory (per step)
``memwatch/host.uss_gib``, ``host.pss_gib``         private / proportional memory (background)
``memwatch/device.allocated_gib`` ...               accelerator allocator counters (CUDA/MPS)
``memwatch/workers.count``                          live DataLoader workers
``memwatch/workers.uss_gib``, ``workers.pss_gib``   DataLoader workers' memory, summed
``memwatch/val/<metric>_gib``                       validation loop, last value of the run
``memwatch/val/<metric>.peak_gib``                  validation loop, peak over the run
``memwatch/test/...``                               test loop, same layout
``memwatch/findings/count``                         new findings at this epoch end
``memwatch/findings/<kind>``                        new findings of that kind
``memwatch/findings/<kind>.<metric>_mib_per_step``  growth rate of a finding
``memwatch/oom``                                    1 when a run died and left a bundle
==================================================  ==============================================
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

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

from memwatch.core.errors import MemWatchWarning
from memwatch.core.findings import Finding
from memwatch.integrations._adapter import (
    GRACEFUL_STOP_WATCHDOG,
    FindingWarner,
    adapter_state,
    check_given,
    check_log_every,
    check_options,
    read_adapter_state,
    session_options,
)
from memwatch.core.metrics import (
    FINDING_COLUMNS,
    PREFIX,
    finding_row,
    findings_metrics,
    is_count,
    to_log_metrics,
)
from memwatch.session import MemWatch

__all__ = ["MemWatchCallback", "MemWatchWarning"]

log = logging.getLogger("memwatch")

_WARN_SEVERITIES = ("warning", "critical")
_MAX_FINDINGS = 1000


class MemWatchCallback(Callback):
    """Watch memory during ``Trainer.fit``: per-step samples, leak verdicts, OOM bundles.

    Args:
        memwatch: a :class:`memwatch.MemWatch` to drive instead of creating one (then pass no
            other MemWatch option). It is started in ``setup`` and closed in ``teardown``.
        log_every_n_steps: log the latest sample every N optimizer steps; ``None`` uses the
            trainer's ``log_every_n_steps``.
        watch_eval: sample validation and test loops too, each in its own timeline (a leak in
            evaluation shows in its own series and findings, never mixed with training's).
        warn: emit a :class:`MemWatchWarning` once per new finding of severity ``warning`` or
            ``critical`` (once per stage, kind and metric); ``info`` findings are only logged.
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
        **memwatch_options: Any,
    ) -> None:
        check_given("MemWatchCallback", memwatch, memwatch_options)
        if log_every_n_steps is not None:
            check_log_every(log_every_n_steps,
                            ", or None to use the trainer's log_every_n_steps.")
        if graceful_stop and memwatch is None and "watchdog" not in memwatch_options:
            memwatch_options["watchdog"] = dict(GRACEFUL_STOP_WATCHDOG)
        check_options("MemWatchCallback", memwatch_options)
        self._options = memwatch_options
        self._given = memwatch
        self.log_every_n_steps = log_every_n_steps
        self.watch_eval = bool(watch_eval)
        self.warn = bool(warn)
        self.graceful_stop = bool(graceful_stop)
        self.stop_checkpoint = None if stop_checkpoint is None else os.fspath(stop_checkpoint)
        self.wandb_sink = bool(wandb_sink)
        # Loggers whose training keys a memwatch W&B sink writes instead of this callback.
        self._sink_loggers: set[int] = set()

        self.memwatch: MemWatch | None = memwatch
        self.eval_memwatch: dict[str, MemWatch] = {}
        self.findings: list[Finding] = []
        self.bundle_path: Path | None = None
        self.stopped_by_memwatch = False
        self._warner = FindingWarner()
        self._every = 1
        self._last_global_step = -1
        self._pending_state: dict[str, Any] | None = None
        self._logging_broken: set[int] = set()
        self._device: Any = "cpu"
        self._out_dir = "memwatch"

    # ------------------------------------------------------------------ hooks
    # Each hook delegates to one private method; none of them may raise into the training loop.

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._setup(trainer, stage)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._on_train_start(trainer)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Hot path: one property read and one comparison unless an optimizer step happened.
        gs = trainer.global_step
        if gs == self._last_global_step:
            return  # gradient accumulation: no optimizer step in this batch
        self._last_global_step = gs
        mw = self.memwatch
        if mw is None:
            return
        mw.step()
        step = _logger_step(trainer, gs)
        if (step + 1) % self._every == 0:
            self._log_train_sample(trainer, mw, step)
            if self.graceful_stop:
                self._check_stop(trainer, mw)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.memwatch is not None:
            self._end_epoch(trainer, self.memwatch, "train")

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._eval_start(trainer, "val")

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        mw = self.eval_memwatch.get("val")
        if mw is not None and not trainer.sanity_checking:
            mw.step()

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        mw = self.eval_memwatch.get("val")
        if mw is not None and not trainer.sanity_checking:
            self._end_epoch(trainer, mw, "val")

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_start(trainer, "test")

    def on_test_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        mw = self.eval_memwatch.get("test")
        if mw is not None:
            mw.step()

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        mw = self.eval_memwatch.get("test")
        if mw is not None:
            self._end_epoch(trainer, mw, "test")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._on_exception(trainer, exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._close_all()

    def state_dict(self) -> dict[str, Any]:
        return self._state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        restored = read_adapter_state(state_dict)  # never raises; None: start fresh
        if restored is None:
            return
        self.findings = restored.findings
        self._warner.warned = restored.warned
        self._pending_state = restored.train
        if self.memwatch is not None and self.memwatch.running and self._pending_state is not None:
            # Lightning restores callbacks after setup() started the session; otherwise
            # setup() hands the state to the new session.
            self.memwatch.load_state_dict(self._pending_state)
            self._pending_state = None

    # ------------------------------------------------------------------ setup
    def _setup(self, trainer: Any, stage: str) -> None:
        self._device = _device_of(trainer)
        self._out_dir = self._default_out_dir(trainer)
        every = self.log_every_n_steps or getattr(trainer, "log_every_n_steps", 50) or 50
        self._every = max(int(every), 1)
        if stage != "fit":
            return  # validate/test: only the evaluation loop is watched, from its start hook
        mw = self.memwatch
        if mw is None or (mw is not self._given and not mw.running):
            mw = self._new_memwatch()
            self.memwatch = mw
        try:
            mw.start()
        except Exception as e:  # noqa: BLE001 - a broken watcher must not stop training
            log.warning("memwatch: could not start (%s: %s); training continues unwatched",
                        type(e).__name__, e)
            self.memwatch = None
            return
        if self._pending_state is not None:
            mw.load_state_dict(self._pending_state)
            self._pending_state = None
        self._attach_wandb_sink(trainer, mw)
        # The validation timeline starts now rather than at the first validation: its buffers
        # are then part of the first training epoch's floor instead of a step between epochs.
        if getattr(trainer, "limit_val_batches", 1) != 0:
            self._eval_start(trainer, "val")

    def _default_out_dir(self, trainer: Any) -> str:
        given = self._options.get("out_dir")
        if given is not None:
            return str(os.fspath(given))
        root = getattr(trainer, "default_root_dir", None) or os.getcwd()
        out = os.path.join(root, "memwatch")
        if getattr(trainer, "world_size", 1) > 1:
            out = os.path.join(out, f"rank{getattr(trainer, 'global_rank', 0)}")
        return out

    def _new_memwatch(self, for_eval: bool = False) -> MemWatch:
        opts = session_options(self._given, self._options, self._device, self._out_dir, for_eval)
        if not for_eval:
            opts.setdefault("log_every_n_steps", self._every)  # sinks follow the trainer's cadence
        return MemWatch(**opts)

    def _attach_wandb_sink(self, trainer: Any, mw: MemWatch) -> None:
        try:
            from memwatch.sinks.wandb import WandbSink

            loggers = [lg for lg in getattr(trainer, "loggers", ())
                       if type(lg).__name__ == "WandbLogger"]
            if not loggers:
                return
            sinks = getattr(getattr(mw, "_sinks", None), "sinks", ())
            present = any(isinstance(s, WandbSink) for s in sinks)
            if not present and self.wandb_sink:
                mw.add_sink(WandbSink(run=loggers[0]))
                present = True
            if present:
                self._sink_loggers.update(id(lg) for lg in loggers)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: W&B sink not attached (%s: %s)", type(e).__name__, e)

    def _on_train_start(self, trainer: Any) -> None:
        self._last_global_step = trainer.global_step
        mw = self.memwatch
        if mw is None or mw.total_steps is not None:
            return
        try:
            total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
            if total is None:
                est = float(trainer.estimated_stepping_batches)
                total = int(est) if math.isfinite(est) and est > 0 else None
            mw.total_steps = total
        except Exception:  # noqa: BLE001 - the forecast horizon is optional
            log.debug("memwatch: run length unknown", exc_info=True)

    def _eval_start(self, trainer: Any, stage: str) -> None:
        if not self.watch_eval:
            return
        mw = self.eval_memwatch.get(stage)
        if mw is not None and mw.running:
            return
        try:
            mw = self._new_memwatch(for_eval=True)
            mw.start()
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not watch the %s loop (%s: %s)", stage,
                        type(e).__name__, e)
            return
        self.eval_memwatch[stage] = mw

    # ------------------------------------------------------------------ logging
    def _log_train_sample(self, trainer: Any, mw: MemWatch, step: int) -> None:
        try:
            metrics = to_log_metrics(mw.latest())
        except Exception as e:  # noqa: BLE001
            log.debug("memwatch: no sample to log (%s)", e)
            return
        self._log_metrics(trainer, metrics, step, train=True)

    def _log_metrics(self, trainer: Any, metrics: dict[str, float], step: int,
                     train: bool = False) -> None:
        if not metrics:
            return
        for logger in getattr(trainer, "loggers", ()):
            if id(logger) in self._logging_broken or (train and id(logger) in self._sink_loggers):
                continue
            try:
                logger.log_metrics(metrics, step=step)
            except Exception as e:  # noqa: BLE001 - one bad logger must not stop the others
                self._logging_broken.add(id(logger))
                log.warning("memwatch: logging to %s disabled after an error (%s: %s)",
                            type(logger).__name__, type(e).__name__, e)

    def _log_eval_summary(self, trainer: Any, mw: MemWatch, stage: str, step: int) -> None:
        epochs = mw.epochs
        if not epochs:
            return
        summary = epochs[-1]
        last = {k: float(summary.last[i]) for i, k in enumerate(summary.keys)}
        peak = {f"{k}.peak": float(summary.peak[i]) for i, k in enumerate(summary.keys)
                if not is_count(k)}
        self._log_metrics(trainer, to_log_metrics({**last, **peak}, stage=stage), step)

    def _log_findings_text(self, trainer: Any, findings: list[Finding], stage: str,
                           step: int) -> None:
        rows = [finding_row(f, stage) for f in findings]
        for logger in getattr(trainer, "loggers", ()):
            if id(logger) in self._logging_broken or (
                    stage == "train" and id(logger) in self._sink_loggers):
                continue
            try:
                if callable(getattr(logger, "log_table", None)):  # W&B
                    logger.log_table(key=f"{PREFIX}/findings_table", columns=list(FINDING_COLUMNS),
                                     data=rows, step=step)
                elif callable(getattr(getattr(logger, "experiment", None), "add_text", None)):
                    logger.experiment.add_text(f"{PREFIX}/findings",
                                               _markdown_table(rows), global_step=step)
            except Exception as e:  # noqa: BLE001
                log.warning("memwatch: could not log the findings table to %s (%s: %s)",
                            type(logger).__name__, type(e).__name__, e)

    # ------------------------------------------------------------------ verdicts
    def _end_epoch(self, trainer: Any, mw: MemWatch, stage: str) -> None:
        new = mw.end_epoch()  # never raises (the session disables what fails)
        step = _logger_step(trainer, trainer.global_step)
        if stage != "train":
            self._log_eval_summary(trainer, mw, stage, step)
            for f in new:
                f.evidence.setdefault("stage", stage)
        self.findings.extend(new)
        del self.findings[:-_MAX_FINDINGS]  # bounded, like the session's own list
        self._log_metrics(trainer, findings_metrics(new, stage=stage), step,
                          train=stage == "train")
        if stage == "train" and mw.rank_summaries:
            # Rank 0 after the epoch-end exchange: every rank's floors and peaks.
            from memwatch.runtime.exchange import rank_log_metrics

            self._log_metrics(trainer, rank_log_metrics(mw.rank_summaries, PREFIX), step)
        if new:
            self._log_findings_text(trainer, new, stage, step)
        if self.warn:
            for f in new:
                # Info-level findings (a warm-up that levelled off) are logged, not warned about:
                # a clean run must stay silent.
                if f.severity in _WARN_SEVERITIES:
                    self._warn_once(trainer, f, stage)

    def _warn_once(self, trainer: Any, f: Finding, stage: str) -> None:
        rank = ""
        if getattr(trainer, "world_size", 1) > 1:
            rank = f" [rank {getattr(trainer, 'global_rank', 0)}]"
        where = "" if stage == "train" else f" [{stage} loop]"
        self._warner.warn(f, rank + where, stage, stacklevel=2)

    # ------------------------------------------------------------------ watchdog
    def _check_stop(self, trainer: Any, mw: MemWatch) -> None:
        try:
            local = bool(getattr(mw, "should_stop", False))
            decision = local
            if getattr(trainer, "world_size", 1) > 1:
                # Opt-in only, and at the logging cadence every rank shares: one boolean reduce,
                # so that every rank saves the (collective) checkpoint and stops together.
                decision = bool(trainer.strategy.reduce_boolean_decision(local, all=False))
            if not decision or self.stopped_by_memwatch:
                return
            self.stopped_by_memwatch = True
            path = self.stop_checkpoint or os.path.join(
                mw.out_dir, f"memwatch-stop-step{trainer.global_step}.ckpt")
            trainer.save_checkpoint(path)
            trainer.should_stop = True
            reason = getattr(mw, "stop_reason", None) or "out of memory is forecast"
            warnings.warn(f"memwatch: stopping training ({reason}); checkpoint saved to {path}",
                          MemWatchWarning, stacklevel=2)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: graceful stop failed (%s: %s); training continues",
                        type(e).__name__, e)

    # ------------------------------------------------------------------ failure
    def _on_exception(self, trainer: Any, exception: BaseException) -> None:
        # Lightning calls this inside its `except` block: anything raised here would replace the
        # user's exception, so nothing may escape.
        try:
            mw = self.memwatch
            if mw is None:
                mw = next(iter(self.eval_memwatch.values()), None)
            handler = getattr(mw, "handle_exception", None)
            path = handler(exception) if callable(handler) else None
            if path is not None:
                self.bundle_path = Path(path)
                self._log_bundle(trainer, self.bundle_path)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not record the failure (%s: %s)", type(e).__name__, e)
        finally:
            self._close_all()

    def _log_bundle(self, trainer: Any, path: Path) -> None:
        step = _logger_step(trainer, trainer.global_step)
        self._log_metrics(trainer, {f"{PREFIX}/oom": 1.0}, step, train=True)
        for logger in getattr(trainer, "loggers", ()):
            try:
                # Hyperparameters are the one text channel every Lightning logger has (CSV writes
                # hparams.yaml, W&B the run config, TensorBoard its hparams).
                logger.log_hyperparams({f"{PREFIX}/oom_bundle": str(path)})
            except Exception as e:  # noqa: BLE001
                log.warning("memwatch: could not log the bundle path to %s (%s: %s)",
                            type(logger).__name__, type(e).__name__, e)
        # The recorder itself logs where the bundle went; no second line here.

    def _close_all(self) -> None:
        for mw in [self.memwatch, *self.eval_memwatch.values()]:
            if mw is not None:
                mw.close()  # idempotent, never raises

    # ------------------------------------------------------------------ checkpoints
    def _state_dict(self) -> dict[str, Any]:
        # {"version": 1, "findings", "warned", "train": MemWatch.state_dict()}: plain data, so
        # torch.load(weights_only=True) reads the checkpoint.
        return adapter_state(self.memwatch, self.findings, self._warner)


# ---------------------------------------------------------------------- helpers
def _device_of(trainer: Any) -> str:
    """The memwatch device spec for the trainer's root device ('cpu' watches host only)."""
    try:
        dev = trainer.strategy.root_device
    except Exception:  # noqa: BLE001
        return "cpu"
    kind = getattr(dev, "type", str(dev))
    if kind == "cuda":
        return f"cuda:{dev.index}" if dev.index is not None else "cuda"
    if kind == "mps":
        return "mps"
    return "cpu"  # CPU, and accelerators memwatch has no probe for (XLA...): host memory only


def _logger_step(trainer: Any, global_step: int) -> int:
    # Lightning logs its own metrics at `_batches_that_stepped`, which at on_train_batch_end is
    # still one behind the optimizer step; using the same value keeps memwatch rows aligned with
    # the loss in every logger.
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    value = getattr(loop, "_batches_that_stepped", None)
    return int(value) if isinstance(value, int) else max(int(global_step) - 1, 0)


def _markdown_table(rows: list[list[Any]]) -> str:
    head = "| " + " | ".join(FINDING_COLUMNS) + " |"
    sep = "|" + "---|" * len(FINDING_COLUMNS)
    body = ["| " + " | ".join("" if v is None else str(v).replace("|", "/") for v in r) + " |"
            for r in rows]
    return "\n".join([head, sep, *body])
