"""Hugging Face ``transformers``: :class:`MemWatchCallback` and :func:`watch_trainer`.

The callback translates ``Trainer`` events into :class:`memwatch.MemWatch` calls and writes what
memwatch found through the trainer's own logging path, so the keys land in
``trainer.state.log_history`` *and* in every ``report_to`` integration (W&B, TensorBoard,
MLflow...).

Four limits of the ``TrainerCallback`` API, and what this module does about them:

* **Logging order.** ``Trainer.log`` appends a *copy* of the row to ``state.log_history`` and then
  calls ``on_log`` on every callback in list order; the reporting callbacks come before user
  callbacks. A key added to ``logs`` in a user ``on_log`` is therefore lost to both. This callback
  finds its trainer once (at ``on_init_end``, or at ``on_train_begin`` when added later), moves
  itself in front of the reporting callbacks, adds its keys to the row *and* to the row already
  stored in ``log_history``; what it reports outside a log row (findings at epoch end, evaluation
  summaries) goes through ``trainer.log`` itself.
* **No exception hook**, and ``on_train_end`` does not run after a crash. The training
  :class:`~memwatch.MemWatch` is started at ``on_train_begin`` and closed at ``on_train_end``; while
  it runs, its flight recorder holds the device OOM observer (evidence captured before the stack
  unwinds) and a chained ``sys.excepthook``. :func:`watch_trainer` adds an explicit guarantee: any
  exception out of ``trainer.train()`` inside it goes through ``handle_exception``.
* **``auto_find_batch_size``**: Accelerate's ``find_executable_batch_size`` catches each OOM and
  calls the training loop again (``on_train_begin`` again, never ``on_train_end``). A second
  ``on_train_begin`` is read as "the last attempt died of an OOM and was recovered": the observer's
  capture becomes an event in :attr:`MemWatchCallback.recovered_ooms` (or, with
  ``recovered_oom="bundle"``, one small bundle for the first of them), never a bundle per retry;
  the final batch size is in :attr:`MemWatchCallback.train_batch_size` and in the logs.
* **``skip_memory_metrics=False``**: transformers' memory tracker resets the allocator's peak
  statistics at each stage. memwatch never resets them and reads the peak per step window
  (:class:`memwatch.probes.base.WindowPeak`), so a reset shows as a lower high-water mark, not as a
  wrong peak; both can run together.

Metric keys: every key of :mod:`memwatch.core.metrics` (samples in the rows the trainer logs;
evaluation under ``memwatch/val/``), plus ``memwatch/recovered_ooms`` (OOMs a batch-size finder
recovered from) and ``memwatch/train_batch_size`` (the batch size training finished with). With
``report_to="wandb"`` memwatch's W&B sink writes them under these names (W&B's callback, which
would prefix them ``train/``, gets the rows without them); ``log_history`` and the other loggers
get them as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    from transformers import TrainerCallback
    from transformers import TrainerControl as Control
    from transformers import TrainerState as State
    from transformers import TrainingArguments as Args
except ImportError as _e:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "memwatch.integrations.transformers needs Hugging Face transformers; install it with "
        "pip install 'memwatch[transformers]'"
    ) from _e

from memwatch.core.compat import override
from memwatch.core.errors import ConfigError, MemWatchWarning
from memwatch.core.metrics import PREFIX
from memwatch.integrations import _adapter as ad
from memwatch.integrations import _driver as drv
from memwatch.integrations import _framework as fw
from memwatch.integrations import _hf_trainer as hf
from memwatch.integrations._loggers import TrainerLog
from memwatch.session import AdapterOptions, MemWatch, Unpack

__all__ = ["STATE_FILE", "MemWatchCallback", "MemWatchWarning", "watch_trainer"]

STATE_FILE = drv.STATE_FILE


class MemWatchCallback(ad.Adapter, TrainerCallback):
    """Watch memory during ``Trainer.train``: per-step samples, leak verdicts, OOM bundles.

    Args:
        memwatch: a :class:`memwatch.MemWatch` to drive for the first training run instead of
            creating one (then pass no other MemWatch option).
        log_every_n_steps: ``None`` (default) adds the latest sample to every row the trainer
            logs (``logging_steps`` cadence, aligned with the loss); an int also logs a row of
            its own every N optimizer steps.
        watch_eval: sample evaluation/prediction loops (``on_prediction_step``) in their own
            timeline, judged at every ``on_evaluate``/``on_predict``; keys under
            ``memwatch/val/``, findings with ``evidence["stage"] == "val"``.
        warn: emit a :class:`memwatch.MemWatchWarning` once per new finding of severity
            ``warning`` or ``critical``; other new leak verdicts get a one-line notice on the
            ``memwatch`` logger, other ``info`` findings are only logged.
        console: what the trainer's printed rows (progress bar, ``PrinterCallback``) show of
            memwatch: ``"one"`` key (default: ``memwatch/device.allocated_gib``, else
            ``memwatch/host.rss_gib``), ``"none"`` or ``"all"``. ``log_history`` and every
            ``report_to`` logger get every key whatever this says.
        graceful_stop: when the watchdog says to stop (``mw.should_stop``), set
            ``control.should_save`` and ``control.should_training_stop`` (the trainer saves a
            checkpoint and ends cleanly). Off by default; unless you pass ``watchdog=...``, it adds
            ``"stop"`` to the watchdog's ``on_forecast`` and ``on_critical`` actions.
        recovered_oom: what an OOM that ``auto_find_batch_size`` recovered from leaves:
            ``"event"`` (default: an entry in :attr:`recovered_ooms`, a log line, no bundle) or
            ``"bundle"`` (also one bundle, without the allocator snapshot, for the first of them).
        **memwatch_options: passed to :class:`memwatch.MemWatch` (``device``, ``out_dir``,
            ``interval_s``, ``census``...). ``device`` defaults to the trainer's device and
            ``out_dir`` to ``<args.output_dir>/memwatch`` (``.../rank<N>`` when distributed).

    Attributes:
        findings: every finding so far (the latest 1,000), training and evaluation.
        memwatch: the training :class:`memwatch.MemWatch` (``None`` before ``on_train_begin``).
        eval_memwatch: ``{"val": MemWatch}`` once an evaluation loop ran.
        bundle_path: the bundle written when the run died (through :func:`watch_trainer`).
        recovered_ooms: one dict per OOM a batch-size finder recovered from.
        train_batch_size: the batch size of the latest (final) training attempt.

    Example::

        >>> from transformers import BertConfig, BertForSequenceClassification, Trainer
        >>> from transformers import PrinterCallback, TrainingArguments
        >>> from memwatch.integrations.transformers import MemWatchCallback
        >>> cfg = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        ...                  intermediate_size=64, vocab_size=100)
        >>> data = [{"input_ids": [1, 2, 3, 4], "labels": 0}] * 8
        >>> args = TrainingArguments(str(tmp), use_cpu=True, per_device_train_batch_size=2,
        ...                          num_train_epochs=1, report_to=[], save_strategy="no",
        ...                          disable_tqdm=True, logging_steps=2)
        >>> cb = MemWatchCallback(workers=False)
        >>> trainer = Trainer(BertForSequenceClassification(cfg), args, train_dataset=data,
        ...                   callbacks=[cb])
        >>> trainer.remove_callback(PrinterCallback)  # no printed log rows in this example
        >>> _ = trainer.train()
        >>> cb.memwatch.step_count, "memwatch/host.rss_gib" in trainer.state.log_history[0]
        (4, True)
    """

    def __init__(
        self,
        memwatch: MemWatch | None = None,
        *,
        watch_eval: bool = True,
        log_every_n_steps: int | None = None,
        recovered_oom: str = "event",
        warn: bool = True, graceful_stop: bool = False, console: str = "one",
        **memwatch_options: Unpack[AdapterOptions],
    ) -> None:
        self._d = drv.Driver(
            "MemWatchCallback", memwatch, memwatch_options, warn=warn, watch_eval=watch_eval,
            graceful_stop=graceful_stop, recovered_oom=recovered_oom,
            stage_labels={"val": "evaluation loop"}, adapter=type(self),
            log_every=(log_every_n_steps, ", or None to add memwatch keys to the trainer's rows."))
        self._log = TrainerLog(lambda: self.trainer, log_every_n_steps is not None, console)
        self._d.use_loggers([self._log])
        self.trainer: Any = None
        self.train_batch_size: int | None = None
        self._attempt_open = False
        self._warned_order = False

    # ------------------------------------------------------------------ hooks
    # Each hook is a line or two of translation; none of them may raise into the training loop.
    # @override: a hook transformers renames is a type error, not a callback that goes quiet.
    @override
    def on_init_end(self, args: Args, state: State, control: Control, **kwargs: Any) -> None:
        if self.trainer is None:
            self.attach(hf.calling_trainer())

    @override
    def on_step_end(self, args: Args, state: State, control: Control, **kwargs: Any) -> None:
        # Hot path: called once per optimizer step (not per micro-batch under accumulation).
        self._d.step()
        if self._d.wants_stop():
            # The trainer saves a checkpoint right after on_step_end when should_save is set,
            # then leaves the loop and runs on_train_end as usual.
            control.should_save = control.should_training_stop = True
            self._d.stopping("the trainer saves a checkpoint first")

    @override
    def on_epoch_end(self, args: Args, state: State, control: Control, **kwargs: Any) -> None:
        self._d.end_epoch("train")

    @override
    def on_prediction_step(self, args: Args, state: State, control: Control, **kwargs: Any) -> None:
        self._d.eval_start("val")
        self._d.eval_step("val")

    @override
    def on_evaluate(self, args: Args, state: State, control: Control, **kwargs: Any) -> None:
        self._d.end_epoch("val")

    @override
    def on_predict(self, args: Args, state: State, control: Control, metrics: Any = None,
                   **kwargs: Any) -> None:
        self._d.end_epoch("val")  # judged like an evaluation

    @override
    def on_log(self, args: Args, state: State, control: Control, logs: Any = None,
               **kwargs: Any) -> None:
        if isinstance(logs, dict):
            self._log.add_to_row(state, logs, self._d.memwatch)

    @override
    def on_train_end(self, args: Args, state: State, control: Control, **kwargs: Any) -> None:
        if self.recovered_ooms and self.train_batch_size is not None:
            self._d.log({f"{PREFIX}/recovered_ooms": float(len(self.recovered_ooms)),
                         f"{PREFIX}/train_batch_size": float(self.train_batch_size)})
        self.close()

    @override
    def on_save(self, args: Args, state: State, control: Control, **kwargs: Any) -> None:
        # After the trainer wrote checkpoint-<global_step>: this process's state goes next to it.
        folder = hf.checkpoint_folder(self.trainer, args, state.global_step)
        if self._d.memwatch is not None and os.path.isdir(folder):
            self._d.save_state_file(folder)

    # ------------------------------------------------------------------ public
    @fw.guarded("attaching the trainer")
    def attach(self, trainer: Any) -> None:
        """Know the trainer: log through ``trainer.log`` and sit before the reporting callbacks.

        Called by itself when the trainer is found (``Trainer(callbacks=[cb])`` and
        ``trainer.add_callback(cb)`` both work); :func:`watch_trainer` calls it explicitly.
        """
        if trainer is None or not hasattr(trainer, "callback_handler"):
            return
        self.trainer = trainer
        args = getattr(trainer, "args", None)
        if args is not None:  # defaults for a failure before on_train_begin, too
            self._configure(args)
        cbs = trainer.callback_handler.callbacks
        hf.before_reporters(cbs, self)
        # The printed rows: one memwatch key (console=...); W&B's: none (memwatch's sink).
        self._log.quiet_printers(cbs, self._d.sinks)

    def close(self) -> None:
        """Close every session this callback opened (idempotent, never raises)."""
        self._d.close()
        self._attempt_open = False

    # ------------------------------------------------------------------ translation
    def _configure(self, args: Any) -> None:
        self._d.configure(args.device, getattr(args, "output_dir", None),
                          getattr(args, "world_size", 1), getattr(args, "process_index", 0))

    @override
    def on_train_begin(self, args: Args, state: State, control: Control, **kwargs: Any) -> None:
        # Again at every run: callbacks may have been added since __init__, and a callback may
        # be reused by another trainer.
        self.attach(hf.calling_trainer() or self.trainer)
        if self.trainer is None and not self._warned_order:
            self._warned_order = True
            fw.log.warning("memwatch: the Trainer was not found; memwatch keys reach log_history "
                        "and callbacks after this one only. Use memwatch.integrations."
                        "transformers.watch_trainer(trainer) to attach it explicitly.")
        if self._attempt_open and getattr(args, "auto_find_batch_size", False):
            # The loop runs again without on_train_end: the batch-size finder caught an OOM and
            # retries with a smaller batch. The failed attempt's samples describe another batch
            # size: the next attempt starts fresh.
            self._d.recovered_oom(failed_batch_size=self.train_batch_size, restart=True)
        elif self._attempt_open:
            # A previous train() died and the program caught the exception: its sessions close
            # now (an unclaimed OOM capture becomes its bundle, as usual).
            self.close()
        self._configure(args)
        self.train_batch_size = fw.as_int(getattr(state, "train_batch_size", None))
        epochs = getattr(state, "num_train_epochs", 0) or 0  # huge for a max_steps-only run
        if self._d.start(state.max_steps, state.max_steps // epochs if epochs else None) is None:
            return
        self._attempt_open = True
        # Resumed from a checkpoint: the path train() was given (up the stack), else the
        # trainer's own naming of the step it resumed at.
        step = int(getattr(state, "global_step", 0) or 0)
        folder = hf.resume_checkpoint() or (
            hf.checkpoint_folder(self.trainer, args, step) if step else None)
        if folder is not None:
            self._d.load_state_file(folder)
        # The evaluation timeline starts with training: its buffers are then part of the first
        # epoch's floor rather than a step between epochs.
        if str(getattr(args, "eval_strategy", "no")).rsplit(".", 1)[-1].lower() != "no":
            self._d.eval_start("val")


@contextmanager
def watch_trainer(trainer: Any, callback: MemWatchCallback | None = None,
                  **options: Any) -> Iterator[MemWatchCallback]:
    """Guarantee a bundle for any exception out of ``trainer.train()`` run inside it.

    Uses the trainer's :class:`MemWatchCallback` (or ``callback``, or a new one made from
    ``options`` and added to the trainer). The exception propagates unchanged, with a note and a
    ``memwatch_bundle`` attribute when a bundle was written; every memwatch session is closed on
    exit.

    Example::

        >>> import torch
        >>> from transformers import PrinterCallback, Trainer, TrainingArguments
        >>> from memwatch.integrations.transformers import watch_trainer
        >>> class Tiny(torch.nn.Module):  # any module that returns a loss
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.layer = torch.nn.Linear(4, 1)
        ...     def forward(self, x, labels):
        ...         return {"loss": (self.layer(x).squeeze(-1) - labels).pow(2).mean()}
        >>> trainer = Trainer(Tiny(), TrainingArguments(str(tmp), use_cpu=True, report_to=[],
        ...                   num_train_epochs=1, save_strategy="no", disable_tqdm=True),
        ...                   train_dataset=[{"x": torch.ones(4), "labels": torch.tensor(0.)}] * 8)
        >>> trainer.remove_callback(PrinterCallback)  # no printed log rows in this example
        >>> with watch_trainer(trainer, workers=False) as cb:
        ...     _ = trainer.train()
        >>> cb.memwatch.step_count
        1
    """
    cbs = trainer.callback_handler.callbacks
    cb = callback or next((c for c in cbs if isinstance(c, MemWatchCallback)), None)
    if cb is None:
        cb = MemWatchCallback(**options)
    elif options:
        raise ConfigError("watch_trainer: the trainer already has a MemWatchCallback; configure "
                          f"that one instead of passing {sorted(options)}.")
    if cb not in cbs:
        trainer.add_callback(cb)
    cb.attach(trainer)
    with fw.failures_recorded(cb):
        yield cb
