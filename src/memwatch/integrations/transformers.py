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

Metric keys (see :mod:`memwatch.core.metrics`). W&B's transformers integration prefixes
every non-eval key with ``train/`` (``train/memwatch/host.rss_gib``); other integrations and
``log_history`` keep them as below.

==================================================  ==============================================
key                                                 meaning
==================================================  ==============================================
``memwatch/host.rss_gib``                           this process's resident memory (latest step)
``memwatch/host.uss_gib``, ``host.pss_gib``         private / proportional memory (background)
``memwatch/device.allocated_gib`` ...               accelerator allocator counters (CUDA/MPS)
``memwatch/workers.count``, ``workers.uss_gib``     DataLoader workers
``memwatch/val/<metric>_gib``, ``.peak_gib``        evaluation loop: last value and peak
``memwatch/findings/count``, ``/<kind>``            new findings at this epoch (or evaluation) end
``memwatch/findings/<kind>.<metric>_mib_per_step``  growth rate of a finding
``memwatch/rank<r>/<metric>.peak_gib``              rank 0, distributed: each rank's epoch peak
``memwatch/rank<r>/<metric>.floor_gib``             ... and floor (from the epoch-end exchange)
``memwatch/ranks/<metric>.imbalance``               rank 0: highest rank's peak / lowest rank's
``memwatch/oom``                                    1 when a run died and left a bundle
``memwatch/recovered_ooms``                         OOMs a batch-size finder recovered from
``memwatch/train_batch_size``                       the batch size training finished with
==================================================  ==============================================
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

try:
    from transformers import Trainer, TrainerCallback
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as _e:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "memwatch.integrations.transformers needs Hugging Face transformers; install it with "
        "pip install 'memwatch[transformers]'"
    ) from _e

from memwatch.core.errors import ConfigError, MemWatchWarning
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
from memwatch.core.metrics import PREFIX, findings_metrics, is_count, to_log_metrics
from memwatch.session import MemWatch

__all__ = ["MemWatchCallback", "MemWatchWarning", "watch_trainer"]

log = logging.getLogger("memwatch")

_WARN_SEVERITIES = ("warning", "critical")
_MAX_FINDINGS = 1000
_RECOVERED_CHOICES = ("event", "bundle")
_EVAL_PREFIXES = ("eval_", "test_")
#: The file this callback writes into every checkpoint folder (``-rank<N>`` for other ranks).
STATE_FILE = "memwatch_state.json"
_REPORTERS: tuple[type, ...] = tuple(
    c for c in INTEGRATION_TO_CALLBACK.values() if isinstance(c, type))


class MemWatchCallback(TrainerCallback):
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
            ``warning`` or ``critical``; ``info`` findings are only logged.
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
        log_every_n_steps: int | None = None,
        watch_eval: bool = True,
        warn: bool = True,
        graceful_stop: bool = False,
        recovered_oom: str = "event",
        **memwatch_options: Any,
    ) -> None:
        check_given("MemWatchCallback", memwatch, memwatch_options)
        if log_every_n_steps is not None:
            check_log_every(log_every_n_steps,
                            ", or None to add memwatch keys to the rows the trainer logs.")
        if recovered_oom not in _RECOVERED_CHOICES:
            raise ConfigError(
                f"recovered_oom={recovered_oom!r}: use 'event' (no bundle) or 'bundle' (one "
                "bundle for the first OOM a batch-size finder recovered from)."
            )
        if graceful_stop and memwatch is None and "watchdog" not in memwatch_options:
            memwatch_options["watchdog"] = dict(GRACEFUL_STOP_WATCHDOG)
        check_options("MemWatchCallback", memwatch_options)
        self._options = memwatch_options
        self._given = memwatch
        self.log_every_n_steps = log_every_n_steps
        self.watch_eval = bool(watch_eval)
        self.warn = bool(warn)
        self.graceful_stop = bool(graceful_stop)
        self.recovered_oom = recovered_oom

        self.memwatch: MemWatch | None = None
        self.eval_memwatch: dict[str, MemWatch] = {}
        self.findings: list[Finding] = []
        self.bundle_path: Path | None = None
        self.recovered_ooms: list[dict[str, Any]] = []
        self.train_batch_size: int | None = None
        self.stopped_by_memwatch = False
        self.trainer: Any = None
        self._warner = FindingWarner()
        self._every = log_every_n_steps or 0
        self._attempt_open = False
        self._in_own_log = False
        self._pending_logs: dict[str, float] = {}
        self._device: Any = "cpu"
        self._out_dir = "memwatch"
        self._rank_label = ""  # " [rank N]" in warnings when several processes train
        self._warned_order = False

    # ------------------------------------------------------------------ hooks
    # Each hook delegates to one private method; none of them may raise into the training loop.

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is None:
            self.attach(_calling_trainer())

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._on_train_begin(args, state)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Hot path: called once per optimizer step (not per micro-batch under accumulation).
        mw = self.memwatch
        if mw is None:
            return
        mw.step()
        if self._every and state.global_step % self._every == 0:
            self._emit(self._sample(mw))
        if self.graceful_stop and mw.should_stop:
            self._stop(control, mw)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.memwatch is not None:
            self._end_epoch(self.memwatch, "train")

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        mw = self.eval_memwatch.get("val")
        if mw is None or not mw.running:
            mw = self._eval_start()
        if mw is not None:
            mw.step()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._eval_end()

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None,
                   **kwargs: Any) -> None:
        self._eval_end()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        self._on_log(state, logs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._on_train_end(state)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._save_state(args, state)

    # ------------------------------------------------------------------ public
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
            self._device = _device_of(args, self._options)
            self._out_dir = _out_dir_of(args, self._options)
        try:
            cbs = trainer.callback_handler.callbacks
            if self not in cbs:
                return
            first = next((i for i, c in enumerate(cbs) if isinstance(c, _REPORTERS)), None)
            mine = cbs.index(self)
            if first is not None and mine > first:
                # Reporting callbacks read `logs` in list order: memwatch must add its keys before
                # they run. Only this callback moves; everybody else keeps their order.
                cbs.pop(mine)
                cbs.insert(first, self)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not order the callback before the reporting "
                        "integrations (%s: %s); memwatch keys may miss them", type(e).__name__, e)

    def handle_exception(self, exc: BaseException) -> Path | None:
        """Record a failure from ``trainer.train()``: a bundle when configured (never raises)."""
        try:
            mw = self.memwatch
            temp = None
            if mw is None or mw.recorder is None:
                # Died before on_train_begin (or the recorder was off): a short-lived session
                # still writes the bundle with what can be captured now.
                opts = dict(self._options)
                opts.setdefault("device", self._device)
                opts.setdefault("out_dir", self._out_dir)
                opts.update(signals=False, watchdog=False, analyze=False)
                opts.pop("sinks", None)  # a few seconds of life: nothing to report to
                temp = MemWatch(**opts).start()
                mw = temp
            try:
                path = mw.handle_exception(exc)
            finally:
                if temp is not None:
                    temp.close()
            if path is not None:
                self.bundle_path = Path(path)
                self._emit({f"{PREFIX}/oom": 1.0})
            return path
        except Exception as e:  # noqa: BLE001 - the user's exception must go on unchanged
            log.warning("memwatch: could not record the failure (%s: %s)", type(e).__name__, e)
            return None

    def close(self) -> None:
        """Close every session this callback opened (idempotent, never raises)."""
        for mw in [self.memwatch, *self.eval_memwatch.values()]:
            if mw is not None:
                mw.close()
        self._attempt_open = False

    # ------------------------------------------------------------------ training lifecycle
    def _on_train_begin(self, args: Any, state: Any) -> None:
        # Again at every run: callbacks may have been added since __init__, and a callback may
        # be reused by another trainer.
        self.attach(_calling_trainer() or self.trainer)
        if self.trainer is None and not self._warned_order:
            self._warned_order = True
            log.warning("memwatch: the Trainer was not found; memwatch keys reach log_history "
                        "and callbacks after this one only. Use memwatch.integrations."
                        "transformers.watch_trainer(trainer) to attach it explicitly.")
        if self._attempt_open:
            if getattr(args, "auto_find_batch_size", False):
                # The loop runs again without on_train_end: the batch-size finder caught an OOM
                # and retries with a smaller batch.
                self._recovered(state)
            else:
                # A previous train() died and the program caught the exception: its sessions
                # close now (an unclaimed OOM capture becomes its bundle, as usual).
                self.close()
        self._device = _device_of(args, self._options)
        self._out_dir = _out_dir_of(args, self._options)
        self._rank_label = _rank_label(args)
        self.train_batch_size = _int_or_none(getattr(state, "train_batch_size", None))
        mw = self._given if self._given is not None and not self._given_used() else None
        try:
            if mw is None:
                mw = self._new_memwatch()
            if mw.total_steps is None and getattr(state, "max_steps", 0) > 0:
                mw.total_steps = int(state.max_steps)
            mw.start()
        except Exception as e:  # noqa: BLE001 - a broken watcher must not stop training
            log.warning("memwatch: could not start (%s: %s); training continues unwatched",
                        type(e).__name__, e)
            self.memwatch = None
            return
        self.memwatch = mw
        self._attempt_open = True
        self._load_state(args, state, mw)
        # The evaluation timeline starts with training: its buffers are then part of the first
        # epoch's floor rather than a step between epochs.
        strategy = getattr(args, "eval_strategy", "no")
        if str(getattr(strategy, "value", strategy)) != "no":
            self._eval_start()

    # ------------------------------------------------------------------ checkpoints
    # transformers' own mechanism for callback state (ExportableState) is not used: it is off
    # unless TrainingArguments(restore_callback_states_from_checkpoint=True), it rebuilds the
    # callback with type(cb)(**saved_args) and puts that new object in place of the user's (whose
    # reference then reads nothing), its args must be JSON (a MemWatch or sinks are not), and it
    # stores everything in trainer_state.json. A file of memwatch's own in the checkpoint folder
    # has none of these limits.
    def _save_state(self, args: Any, state: Any) -> None:
        """``on_save`` (after the trainer wrote checkpoint-<global_step>): write this process's
        state next to it. Never raises."""
        try:
            mw = self.memwatch
            if mw is None:
                return
            folder = os.path.join(_run_dir(self.trainer, args),
                                  f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if not os.path.isdir(folder):
                log.debug("memwatch: checkpoint folder %s not found; state not saved", folder)
                return
            path = os.path.join(folder, _state_file(args))
            data = adapter_state(mw, self.findings, self._warner)
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, allow_nan=False)
            os.replace(tmp, path)
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: could not save its state with the checkpoint (%s: %s)",
                        type(e).__name__, e)

    def _load_state(self, args: Any, state: Any, mw: MemWatch) -> None:
        """``on_train_begin`` of ``train(resume_from_checkpoint=...)``: continue from the state
        saved in that checkpoint, if it has one. Never raises."""
        try:
            folder = _resume_checkpoint()
            if folder is None and int(getattr(state, "global_step", 0) or 0) > 0:
                # Resumed, but the path was not found up the stack: the trainer's own naming.
                folder = os.path.join(_run_dir(self.trainer, args),
                                      f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if folder is None:
                return
            path = os.path.join(os.fspath(folder), _state_file(args))
            if not os.path.isfile(path):
                log.info("memwatch: %s has no memwatch state; the analysis starts fresh", folder)
                return
            with open(path, encoding="utf-8") as f:
                restored = read_adapter_state(json.load(f))
            if restored is None:
                return
            self.findings = restored.findings
            self._warner.warned = restored.warned
            if restored.train is not None:
                mw.load_state_dict(restored.train)
        except Exception as e:  # noqa: BLE001 - a bad state must not stop the resumed run
            log.warning("memwatch: could not read its state from the checkpoint (%s: %s); the "
                        "analysis starts fresh", type(e).__name__, e)

    def _given_used(self) -> bool:
        g = self._given
        return g is None or g is self.memwatch or getattr(g, "_closed", False)

    def _new_memwatch(self, for_eval: bool = False) -> MemWatch:
        return MemWatch(**session_options(self._given, self._options, self._device,
                                          self._out_dir, for_eval))

    def _on_train_end(self, state: Any) -> None:
        extra: dict[str, float] = {}
        if self.recovered_ooms:
            extra[f"{PREFIX}/recovered_ooms"] = float(len(self.recovered_ooms))
        if self.recovered_ooms and self.train_batch_size is not None:
            extra[f"{PREFIX}/train_batch_size"] = float(self.train_batch_size)
            log.info("memwatch: training finished with batch size %d after %d recovered OOM(s)",
                     self.train_batch_size, len(self.recovered_ooms))
        self._emit(extra)
        self.close()

    def _recovered(self, state: Any) -> None:
        mw = self.memwatch
        event: dict[str, Any] = {
            "attempt": len(self.recovered_ooms) + 1,
            "batch_size": self.train_batch_size,
            "steps_done": mw.step_count if mw is not None else None,
            "tried_to_allocate": None,
            "bundle": None,
        }
        try:
            rec = mw.recorder if mw is not None else None
            cap = rec.take_pending() if rec is not None else None
            if cap is not None and cap.observer:
                event["tried_to_allocate"] = cap.observer.get("tried_to_allocate")
            if (rec is not None and cap is not None and self.recovered_oom == "bundle"
                    and not any(e["bundle"] for e in self.recovered_ooms)):
                small = dataclasses.replace(cap, snapshot=None)
                path = rec.write_recovered(
                    small, f"out of memory at batch size {self.train_batch_size}; recovered by "
                    "the batch-size finder, which retried with a smaller batch")
                event["bundle"] = None if path is None else str(path)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not record the recovered OOM (%s: %s)",
                        type(e).__name__, e)
        self.recovered_ooms.append(event)
        log.info("memwatch: out of memory at batch size %s after %s step(s), recovered by "
                 "auto_find_batch_size; retrying with a smaller batch", event["batch_size"],
                 event["steps_done"])
        # The failed attempt's samples describe another batch size: start the next one fresh.
        self.close()
        self.memwatch = None
        self.eval_memwatch = {}
        self._emit({f"{PREFIX}/recovered_ooms": float(len(self.recovered_ooms))})

    # ------------------------------------------------------------------ evaluation
    def _eval_start(self) -> MemWatch | None:
        if not self.watch_eval:
            return None
        try:
            mw = self._new_memwatch(for_eval=True)
            mw.start()
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not watch the evaluation loop (%s: %s)",
                        type(e).__name__, e)
            self.watch_eval = False
            return None
        self.eval_memwatch["val"] = mw
        return mw

    def _eval_end(self) -> None:
        mw = self.eval_memwatch.get("val")
        if mw is None or not mw.running:
            return
        self._end_epoch(mw, "val")

    # ------------------------------------------------------------------ logging
    @staticmethod
    def _sample(mw: MemWatch) -> dict[str, float]:
        try:
            return to_log_metrics(mw.latest())
        except Exception as e:  # noqa: BLE001
            log.debug("memwatch: no sample to log (%s)", e)
            return {}

    def _on_log(self, state: Any, logs: Any) -> None:
        if self._in_own_log or not isinstance(logs, dict):
            return
        try:
            extra, self._pending_logs = self._pending_logs, {}
            mw = self.memwatch
            if mw is not None and not any(str(k).startswith(_EVAL_PREFIXES) for k in logs):
                extra.update(self._sample(mw))
            if not extra:
                return
            history = getattr(state, "log_history", None)
            row = history[-1] if history else None
            # Trainer.log stored a copy of this row before calling on_log: update that copy too,
            # after checking it is the same row.
            same = (isinstance(row, dict) and row.get("step") == state.global_step
                    and all(k in row for k in logs))
            logs.update(extra)
            if same and isinstance(row, dict):
                row.update(extra)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not add memwatch keys to the log row (%s: %s)",
                        type(e).__name__, e)

    def _emit(self, metrics: dict[str, float]) -> None:
        """A row of memwatch's own, through the trainer's logging path when it is known."""
        if not metrics:
            return
        trainer = self.trainer
        if trainer is None:
            self._pending_logs.update(metrics)  # rides on the trainer's next row
            return
        self._in_own_log = True
        try:
            trainer.log(dict(metrics))
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: trainer.log failed (%s: %s); keeping the keys for the next "
                        "row", type(e).__name__, e)
            self._pending_logs.update(metrics)
        finally:
            self._in_own_log = False

    # ------------------------------------------------------------------ verdicts
    def _end_epoch(self, mw: MemWatch, stage: str) -> None:
        new = mw.end_epoch()  # never raises (the session disables what fails)
        out: dict[str, float] = {}
        if stage != "train":
            for f in new:
                f.evidence.setdefault("stage", stage)
            epochs = mw.epochs
            if epochs:
                s = epochs[-1]
                last = {k: float(s.last[i]) for i, k in enumerate(s.keys)}
                peak = {f"{k}.peak": float(s.peak[i]) for i, k in enumerate(s.keys)
                        if not is_count(k)}
                out.update(to_log_metrics({**last, **peak}, stage=stage))
        self.findings.extend(new)
        del self.findings[:-_MAX_FINDINGS]
        try:
            out.update(findings_metrics(new, stage=stage))
            if stage == "train" and mw.rank_summaries:
                # Rank 0 after the epoch-end exchange: every rank's floors and peaks, in the same
                # row as the findings (Trainer.log runs on every process; only rank 0 has them).
                from memwatch.runtime.exchange import rank_log_metrics

                out.update(rank_log_metrics(mw.rank_summaries, PREFIX))
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: findings not logged (%s: %s)", type(e).__name__, e)
        self._emit(out)
        if self.warn:
            for f in new:
                if f.severity in _WARN_SEVERITIES:  # info findings stay silent (clean runs)
                    self._warn_once(f, stage)

    def _warn_once(self, f: Finding, stage: str) -> None:
        where = "" if stage == "train" else " [evaluation loop]"
        self._warner.warn(f, self._rank_label + where, stage, stacklevel=2)

    # ------------------------------------------------------------------ watchdog
    def _stop(self, control: Any, mw: MemWatch) -> None:
        if self.stopped_by_memwatch:
            return
        try:
            self.stopped_by_memwatch = True
            # The trainer saves a checkpoint right after on_step_end when should_save is set,
            # then leaves the loop and runs on_train_end as usual.
            control.should_save = True
            control.should_training_stop = True
            reason = getattr(mw, "stop_reason", None) or "out of memory is forecast"
            warnings.warn(f"memwatch: stopping training ({reason}); the trainer saves a "
                          "checkpoint first", MemWatchWarning, stacklevel=2)
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: graceful stop failed (%s: %s); training continues",
                        type(e).__name__, e)


@contextmanager
def watch_trainer(trainer: Any, callback: MemWatchCallback | None = None,
                  **options: Any) -> Iterator[MemWatchCallback]:
    """Guarantee a bundle for any exception out of ``trainer.train()`` run inside it.

    Uses the trainer's :class:`MemWatchCallback` (or ``callback``, or a new one made from
    ``options`` and added to the trainer). The exception propagates unchanged, with a note and a
    ``memwatch_bundle`` attribute when a bundle was written; every memwatch session is closed on
    exit.

    Example::

        >>> from transformers import BertConfig, BertForSequenceClassification, Trainer
        >>> from transformers import PrinterCallback, TrainingArguments
        >>> from memwatch.integrations.transformers import watch_trainer
        >>> cfg = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        ...                  intermediate_size=64, vocab_size=100)
        >>> args = TrainingArguments(str(tmp), use_cpu=True, num_train_epochs=1, report_to=[],
        ...                          save_strategy="no", disable_tqdm=True)
        >>> trainer = Trainer(BertForSequenceClassification(cfg), args,
        ...                   train_dataset=[{"input_ids": [1, 2], "labels": 0}] * 4)
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
    try:
        yield cb
    except BaseException as e:
        cb.handle_exception(e)  # KeyboardInterrupt/SystemExit: no bundle, still re-raised
        raise
    finally:
        cb.close()


# ---------------------------------------------------------------------- helpers
def _calling_trainer() -> Any:
    """The ``Trainer`` whose event is being dispatched, from the caller frames (None if absent).

    ``TrainerCallback`` events carry no trainer; the handler's ``call_event`` is called from a
    ``Trainer`` method a few frames up. Done once per run, never on the hot path.
    """
    f: FrameType | None = sys._getframe(1)
    for _ in range(16):
        if f is None:
            break
        obj = f.f_locals.get("self")
        if isinstance(obj, Trainer):
            return obj
        f = f.f_back
    return None


def _resume_checkpoint() -> str | None:
    """The checkpoint folder ``Trainer.train(resume_from_checkpoint=...)`` resumes from (the
    training loop's argument, already resolved from ``True``), from the caller frames."""
    f: FrameType | None = sys._getframe(1)
    for _ in range(16):
        if f is None:
            break
        loc = f.f_locals
        if isinstance(loc.get("self"), Trainer) and "resume_from_checkpoint" in loc:
            value = loc["resume_from_checkpoint"]
            return os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
        f = f.f_back
    return None


def _run_dir(trainer: Any, args: Any) -> str:
    """Where the trainer puts its checkpoint folders (a trial's folder under hyper-parameter
    search)."""
    try:
        if trainer is not None:
            return str(trainer._get_output_dir(trial=getattr(trainer, "_trial", None)))
    except Exception:  # noqa: BLE001
        pass
    return str(getattr(args, "output_dir", None) or os.getcwd())


def _state_file(args: Any) -> str:
    rank = int(getattr(args, "process_index", 0) or 0)
    return STATE_FILE if rank == 0 else STATE_FILE.replace(".json", f"-rank{rank}.json")


def _device_of(args: Any, options: dict[str, Any]) -> Any:
    if "device" in options:
        return options["device"]
    try:
        dev = args.device
    except Exception:  # noqa: BLE001
        return "cpu"
    kind = getattr(dev, "type", str(dev))
    if kind == "cuda":
        return f"cuda:{dev.index}" if dev.index is not None else "cuda"
    if kind == "mps":
        return "mps"
    return "cpu"  # CPU, and devices memwatch has no probe for: host memory only


def _out_dir_of(args: Any, options: dict[str, Any]) -> str:
    given = options.get("out_dir")
    if given is not None:
        return str(os.fspath(given))
    root = getattr(args, "output_dir", None) or os.getcwd()
    out = os.path.join(root, "memwatch")
    if int(getattr(args, "world_size", 1) or 1) > 1:
        out = os.path.join(out, f"rank{getattr(args, 'process_index', 0)}")
    return out


def _rank_label(args: Any) -> str:
    try:
        if int(getattr(args, "world_size", 1) or 1) > 1:
            return f" [rank {int(getattr(args, 'process_index', 0) or 0)}]"
    except (TypeError, ValueError):
        pass
    return ""


def _int_or_none(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None
