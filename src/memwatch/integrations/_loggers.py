"""The frameworks' own logging paths as memwatch sinks: Lightning's ``trainer.loggers``,
transformers' ``trainer.log`` (``log_history`` and every ``report_to`` integration), and
``accelerator.log`` (every tracker of ``log_with=``).

:class:`LoggerSink` turns what a session reports into logger keys (:mod:`memwatch.core.metrics`)
the same way for all three: per-step samples, one row per check (the findings' counts and rates;
an evaluation loop's last and peak values; rank 0's per-rank figures), the findings table where a
logger takes tables, and the keys an adapter reports outside checks. The subclasses only say how
their framework writes a row. They import no framework (duck typing), and a logger that raises
is disabled by the :class:`memwatch.sinks.SinkSet` like any sink.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memwatch.core.errors import ConfigError
from memwatch.core.metrics import (
    FINDING_COLUMNS,
    PREFIX,
    check_metrics,
    finding_row,
    to_log_metrics,
)
from memwatch.core.protocols import CheckReport
from memwatch.integrations._wandb import WANDB_TRACKER, cover_wandb
from memwatch.sinks.base import NullSink

log = logging.getLogger("memwatch")

#: What the HF Trainer's printed rows may show of memwatch (``MemWatchCallback(console=...)``).
CONSOLE_CHOICES = ("one", "none", "all")
#: The one key a printed row keeps with ``console="one"``: the first of these in the row.
CONSOLE_KEYS = (f"{PREFIX}/device.allocated_gib", f"{PREFIX}/host.rss_gib")
# transformers' callbacks that print the rows (matched by class name: no framework import).
_PRINTERS = frozenset({"ProgressCallback", "PrinterCallback", "NotebookProgressCallback"})
_QUIET = "_memwatch_quiet"

__all__ = ["AccelerateLog", "CONSOLE_CHOICES", "CONSOLE_KEYS", "LightningLogger", "LoggerSink",
           "TrainerLog", "check_metrics"]


class LoggerSink(NullSink):
    """A framework's logging path as a sink; subclasses implement :meth:`write`. Bundles reach
    the loggers through :meth:`on_failure_bundle` only; the framework owns its loggers (nothing
    to close).

    Args:
        train: write training samples and training checks (False where a memwatch W&B sink
            already writes them to the same run).
    """

    def __init__(self, train: bool = True) -> None:
        self.train = train

    # ------------------------------------------------------------------ the sink protocol
    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        if self.train:
            metrics = to_log_metrics(sample)
            if metrics:
                self.write(metrics, step)

    def on_check(self, report: CheckReport) -> None:
        row = check_metrics(report, self.train)
        if row:
            self.write(row, report.step)
        if report.findings and self.train:  # (else the memwatch W&B sink writes the table)
            self.write_table([finding_row(f, report.stage) for f in report.findings],
                             report.step)

    def on_log(self, metrics: Mapping[str, float], step: int | None) -> None:
        if self.train:
            self.write(dict(metrics), step)

    def on_failure_bundle(self, path: Path) -> None:
        self.write_text(f"{PREFIX}/oom_bundle", str(path))

    # ------------------------------------------------------------------ what subclasses say
    def write(self, metrics: dict[str, float], step: int | None) -> None:
        raise NotImplementedError

    def write_table(self, rows: list[list[Any]], step: int | None) -> None:
        """The findings table, where the logger takes tables (default: it does not)."""

    def write_text(self, key: str, value: str) -> None:
        """A piece of text (default: not written)."""


class LightningLogger(LoggerSink):
    """One of ``trainer.loggers`` (CSV, TensorBoard, W&B, MLflow...), at Lightning's step."""

    def __init__(self, logger: Any, step: Callable[[], int], train: bool = True) -> None:
        super().__init__(train)
        self.logger = logger
        self.step = step
        self.sink_name = f"the trainer's {type(logger).__name__}"

    def write(self, metrics: dict[str, float], step: int | None) -> None:
        self.logger.log_metrics(metrics, step=self.step())

    def write_table(self, rows: list[list[Any]], step: int | None) -> None:
        if callable(getattr(self.logger, "log_table", None)):  # W&B
            self.logger.log_table(key=f"{PREFIX}/findings_table", columns=list(FINDING_COLUMNS),
                                  data=rows, step=self.step())
        elif callable(getattr(getattr(self.logger, "experiment", None), "add_text", None)):
            self.logger.experiment.add_text(f"{PREFIX}/findings", markdown_table(rows),
                                            global_step=self.step())

    def write_text(self, key: str, value: str) -> None:
        # Hyperparameters are the one text channel every Lightning logger has (CSV writes
        # hparams.yaml, W&B the run config, TensorBoard its hparams).
        self.logger.log_hyperparams({key: value})


class TrainerLog(LoggerSink):
    """``trainer.log``: rows land in ``state.log_history`` and every ``report_to`` integration.

    Keys written before the trainer is known wait in :attr:`pending` and ride on the trainer's
    next row (the callback adds them in ``on_log``).

    ``console``: what the trainer's *printed* rows (``ProgressCallback``, ``PrinterCallback``,
    the notebook table) show of memwatch: ``"one"`` key (the main memory level,
    :data:`CONSOLE_KEYS`), ``"none"``, or ``"all"``; memwatch's own rows (findings, evaluation
    summaries) are printed only with ``"all"``. ``log_history`` and the ``report_to`` loggers
    always get every key: only what the printer is handed changes (:meth:`quiet_printers`).
    """

    def __init__(self, trainer: Callable[[], Any], samples: bool, console: str = "one") -> None:
        super().__init__(train=True)
        if console not in CONSOLE_CHOICES:
            raise ConfigError(f"console={console!r} is not understood; use one of "
                              f"{CONSOLE_CHOICES} (memwatch keys in the trainer's printed rows).")
        self.trainer = trainer
        self.samples = samples  # own rows every N steps (else samples ride on the trainer's)
        self.console = console
        self.pending: dict[str, float] = {}
        self.in_own_log = False
        self.sink_name = "trainer.log"
        #: memwatch's W&B sinks that write into the run W&B's callback logs to.
        self.wandb: list[Any] = []

    def quiet_printers(self, callbacks: list[Any], sinks: Any = None) -> None:
        """Hand the trainer's printing callbacks a row without memwatch's keys (but one, with
        ``console="one"``): their ``on_log`` is wrapped on the instance, nothing else changes,
        and the reporting callbacks still get the whole row, but W&B's: with ``sinks`` (the
        driver's), a memwatch W&B sink writes memwatch's keys into that run
        (:mod:`memwatch.integrations._wandb`), and W&B's callback gets the row without them."""
        for cb in callbacks:
            names = {c.__name__ for c in type(cb).__mro__}
            bound = getattr(cb, "on_log", None)
            if not callable(bound) or getattr(bound, _QUIET, False):
                continue
            if names & _PRINTERS:
                vars(cb)["on_log"] = _printing(bound, weakref.ref(self))
            elif "WandbCallback" in names and sinks is not None and cover_wandb(sinks):
                vars(cb)["on_log"] = _without_memwatch(bound)
                # The sink's samples follow the trainer's rows, as this path's do.
                self.wandb = [s for s in sinks if type(s).__name__ == "WandbSink"]

    def printed(self, logs: Any) -> Any:
        """What a printing callback gets of ``logs`` (``None``: nothing to print)."""
        if self.console == "all" or not isinstance(logs, dict):
            return logs
        if self.in_own_log:
            return None  # memwatch's own rows are for the loggers
        keep = next((k for k in CONSOLE_KEYS if k in logs), None) \
            if self.console == "one" else None
        return {k: v for k, v in logs.items() if not str(k).startswith(PREFIX + "/") or k == keep}

    def on_metrics(self, step: int, sample: Mapping[str, float]) -> None:
        if self.samples:
            super().on_metrics(step, sample)

    def add_to_row(self, state: Any, logs: dict[str, Any], mw: Any) -> None:
        """``on_log``: add the latest sample of ``mw`` (not to evaluation rows) and the keys
        waiting for a row to the row the trainer logs, and to the copy of it ``Trainer.log``
        already stored in ``log_history``."""
        if self.in_own_log:
            return
        try:
            extra, self.pending = self.pending, {}
            if mw is not None and not any(str(k).startswith(("eval_", "test_")) for k in logs):
                latest = mw.latest()
                extra.update(to_log_metrics(latest))
                for sink in self.wandb:  # joins the row W&B's callback is about to log
                    sink.on_metrics(int(getattr(state, "global_step", 0) or 0), latest)
            if not extra:
                return
            history = getattr(state, "log_history", None)
            row = history[-1] if history else None
            same = isinstance(row, dict) and row.get("step") == state.global_step and \
                all(k in row for k in logs)
            logs.update(extra)
            if same and isinstance(row, dict):
                row.update(extra)
        except Exception as e:  # noqa: BLE001 - the trainer's own row must go on
            log.warning("memwatch: could not add memwatch keys to the log row (%s: %s)",
                        type(e).__name__, e)

    def write(self, metrics: dict[str, float], step: int | None) -> None:
        trainer = self.trainer()
        if trainer is None:
            self.pending.update(metrics)
            return
        self.in_own_log = True
        # Trainer.log runs the callbacks' on_log, which clears control.should_log: called from
        # on_step_end (a check inside the epoch), it would cancel the trainer's own row of that
        # step (the loss) in log_history, the console and every report_to integration.
        control = getattr(trainer, "control", None)
        should_log = getattr(control, "should_log", None)
        try:
            trainer.log(dict(metrics))
        finally:
            self.in_own_log = False
            control = getattr(trainer, "control", None)
            if should_log is not None and control is not None:
                control.should_log = should_log


class AccelerateLog(LoggerSink):
    """``accelerator.log``'s trackers (the main process only; nothing is built without
    trackers). With ``sinks`` (the driver's) and a W&B tracker, a memwatch W&B sink on its run
    writes memwatch's keys into it (:mod:`memwatch.integrations._wandb`): this path leaves that
    tracker to it.

    ``step``: ``"optimizer"`` (memwatch's count of optimizer steps), ``None`` (each tracker's
    own counter) or a callable returning the loop's step.
    """

    def __init__(self, accelerator: Any, step: str | Callable[[], int] | None,
                 sinks: Any = None) -> None:
        if not (step is None or step == "optimizer" or callable(step)):
            raise ConfigError(f"step={step!r} is not understood; use 'optimizer', None, or a "
                              "callable returning your loop's step.")
        super().__init__(train=True)
        self.accelerator = accelerator
        self.step = step
        self.main = bool(getattr(accelerator, "is_main_process", True))
        self.sink_name = "accelerator.log"
        wandb = next((t for t in getattr(accelerator, "trackers", []) or []
                      if getattr(t, "name", None) == WANDB_TRACKER), None)
        #: Trackers left to a memwatch sink.
        self.skip = {WANDB_TRACKER} if wandb is not None and sinks is not None and \
            cover_wandb(sinks, wandb) else set()

    def _step(self, n: int | None) -> int | None:
        if callable(self.step):
            return int(self.step())
        return n if self.step == "optimizer" else None

    def _trackers(self) -> list[Any]:
        if not self.main:
            return []
        return [t for t in list(self.accelerator.trackers or [])
                if getattr(t, "name", None) not in self.skip]

    def write(self, metrics: dict[str, float], step: int | None) -> None:
        # As accelerator.log does it, tracker by tracker (but those left to a memwatch sink).
        for tracker in self._trackers():
            tracker.log(metrics, step=self._step(step))

    def write_table(self, rows: list[list[Any]], step: int | None) -> None:
        for tracker in self._trackers():
            if callable(getattr(tracker, "log_table", None)):
                tracker.log_table(f"{PREFIX}/findings_table", columns=list(FINDING_COLUMNS),
                                  data=rows, step=self._step(step))


def _without_memwatch(on_log: Callable[..., Any]) -> Callable[..., Any]:
    """W&B's callback, handed rows without memwatch's keys (memwatch's W&B sink writes them);
    a row of memwatch's alone (a check's counts) is not handed on at all."""
    def quiet(args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        if isinstance(logs, dict):
            kept = {k: v for k, v in logs.items() if not str(k).startswith(PREFIX + "/")}
            if logs and not kept:
                return None
            logs = kept
        return on_log(args, state, control, logs=logs, **kwargs)

    setattr(quiet, _QUIET, True)
    return quiet


def _printing(on_log: Callable[..., Any], sink: weakref.ref[TrainerLog]) -> Callable[..., Any]:
    def quiet(args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        log_sink = sink()
        shown = logs if log_sink is None else log_sink.printed(logs)
        return None if shown is None else on_log(args, state, control, logs=shown, **kwargs)

    setattr(quiet, _QUIET, True)
    return quiet


def markdown_table(rows: list[list[Any]]) -> str:
    head = "| " + " | ".join(FINDING_COLUMNS) + " |"
    sep = "|" + "---|" * len(FINDING_COLUMNS)
    body = ["| " + " | ".join("" if v is None else str(v).replace("|", "/") for v in r) + " |"
            for r in rows]
    return "\n".join([head, sep, *body])
