"""The one adapter driver: everything the Lightning and transformers callbacks and the Accelerate
hook do the same way, so each adapter only translates its framework's events.

A :class:`Driver` owns, for one adapter:

* the training session and one evaluation session per loop (``"val"``, ``"test"``), created
  with the framework's device and output folder as defaults (:meth:`Driver.configure`);
* one :class:`memwatch.sinks.SinkSet` shared by all of them: the user's sinks and the
  framework's own loggers (:mod:`memwatch.integrations._loggers`), so there is one fan-out and
  one failure rule;
* the findings of every session, the warnings given, recovered OOMs (one schema), the graceful
  stop and its reason, the failure bundle, and the checkpoint state (a dict, or a file beside
  the framework's checkpoint).

Nothing here imports a framework, and nothing raises into the training loop after construction.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memwatch.analysis.beliefs import current
from memwatch.bundle.paths import per_rank
from memwatch.core.errors import ConfigError, MemWatchWarning
from memwatch.core.findings import Finding
from memwatch.core.metrics import PREFIX
from memwatch.integrations._findings import AdapterFindings
from memwatch.integrations._framework import check_log_every, device_spec, own_arguments
from memwatch.integrations._recovered import RecoveredOOMs
from memwatch.integrations._state import (
    ADAPTER_STATE_VERSION,
    STATE_FILE,
    RestoredState,
    read_adapter_state,
    read_state_file,
    write_state_file,
)
from memwatch.runtime.dispatch import SinkSet
from memwatch.runtime.warn import user_stacklevel
from memwatch.session import MemWatch, WatchConfig
from memwatch.session.options import check_names

__all__ = ["ADAPTER_STATE_VERSION", "GRACEFUL_STOP_WATCHDOG", "STATE_FILE", "Driver",
           "read_adapter_state"]

log = logging.getLogger("memwatch")

#: What ``graceful_stop=True`` asks of the watchdog when the user configured none: it decides when
#: to stop (OOM forecast within its horizon, or critical usage); the adapter turns that decision
#: into a checkpoint and a clean stop.
GRACEFUL_STOP_WATCHDOG: dict[str, Any] = {"on_critical": ("alert", "bundle", "stop"),
                                          "on_forecast": ("alert", "stop")}
_MAX_FINDINGS = 1000


class Driver:
    """The sessions, fan-out, warnings, stops, failures and checkpoints of one adapter.

    Args:
        who: how errors name the adapter (``"MemWatchCallback"``, ``"attach()"``).
        adapter: the adapter's class: an unknown option's closest name may be one of its own
            arguments (``wach_eval`` -> ``watch_eval``).
        given: a :class:`memwatch.MemWatch` the user passed (then ``options`` must be empty); it
            drives the first training run, later runs get a new session with its options.
        options: :class:`memwatch.MemWatch` options, validated now.
        warn: warn once per new finding of severity warning or critical (without it, a new leak
            still gets its one-line notice).
        watch_eval: watch evaluation loops in sessions of their own.
        graceful_stop: the watchdog may stop the run (the adapter saves a checkpoint and stops);
            adds the stop actions to a watchdog the user did not configure.
        stage_labels: how warnings name a loop (``{"val": "val loop"}``).
    """

    def __init__(self, who: str, given: MemWatch | None, options: Mapping[str, Any], *,
                 adapter: type | None = None,
                 warn: bool = True, watch_eval: bool = True, graceful_stop: bool = False,
                 recovered_oom: str = "event", log_every: tuple[Any, str] | None = None,
                 stage_labels: dict[str, str] | None = None) -> None:
        if log_every is not None and log_every[0] is not None:
            check_log_every(*log_every)
        #: The adapter's own logging cadence, the sinks' default (None: the framework's).
        self.log_every_n_steps: int | None = log_every[0] if log_every is not None else None
        #: OOMs a batch-size finder recovered from.
        self.ooms = RecoveredOOMs(recovered_oom)
        if given is not None and options:
            raise ConfigError(f"{who} got memwatch=... and MemWatch options {sorted(options)}; "
                              "configure the MemWatch you pass instead.")
        if given is not None and not isinstance(given, MemWatch):
            raise ConfigError(f"memwatch={given!r} is not a memwatch.MemWatch; pass one or "
                              "leave it None.")
        # A typo fails here, not in the middle of training: an unknown name (the closest of
        # the MemWatch options and the adapter's own arguments named), then every value.
        check_names(options, who, extra=own_arguments(adapter) if adapter is not None else ())
        options = dict(options)
        if graceful_stop and given is None and "watchdog" not in options:
            options["watchdog"] = dict(GRACEFUL_STOP_WATCHDOG)
        WatchConfig(**{"device": "cpu", **options})
        self.who, self.given, self.options = who, given, options
        self.watch_eval = bool(watch_eval)
        self.graceful_stop = bool(graceful_stop)
        #: The user's sinks and the framework's loggers: one fan-out, one failure rule.
        self.sinks = given.sinks if given is not None else SinkSet(options.pop("sinks", None))
        #: What every check of this adapter's sessions found, kept and told once.
        self.told = AdapterFindings(self.sinks, warn=warn, stage_labels=stage_labels)
        self._loggers: list[Any] = []
        self.memwatch: MemWatch | None = None
        self.eval_memwatch: dict[str, MemWatch] = {}
        self.bundle_path: Path | None = None
        self.stopped_by_memwatch = False
        self.stop_reason: str | None = None
        self.device: Any = "cpu"
        self.out_dir = "memwatch"
        self.rank = 0
        self.world_size = 1
        self._given_used = False
        self._pending_state: RestoredState | None = None

    # ------------------------------------------------------------------ configuration
    def configure(self, device: Any, root: str | os.PathLike[str] | None, world_size: int = 1,
                  rank: int = 0) -> None:
        """The framework's defaults: the device it trains on and its output folder
        (``<root>/memwatch``, ``.../rank<N>`` when several processes train)."""
        self.world_size, self.rank = max(int(world_size or 1), 1), int(rank or 0)
        self.told.rank_label = f" [rank {self.rank}]" if self.world_size > 1 else ""
        self.device = self.options.get("device", device_spec(device))
        given = self.options.get("out_dir")
        if given is not None:
            self.out_dir = str(os.fspath(given))
        else:
            out = os.path.join(os.fspath(root or os.getcwd()), "memwatch")
            self.out_dir = per_rank(out, self.rank, self.world_size)

    def use_loggers(self, sinks: list[Any]) -> None:
        """The framework's own loggers as sinks (replacing those of a previous run)."""
        for s in self._loggers:
            self.sinks.remove(s)
        self._loggers = list(sinks)
        mw = self.memwatch
        for s in self._loggers:
            if mw is not None and mw.running and mw.sinks is self.sinks:
                mw.add_sink(s)  # re-plans the running session's sample cadence
            else:
                self.sinks.add(s)

    def config(self, defaults: dict[str, Any] | None = None, **overrides: Any) -> WatchConfig:
        """The configuration of a session this driver starts: the user's options over the
        framework's ``defaults``, then ``overrides``."""
        if self.given is not None:
            base = dataclasses.replace(self.given.config, sinks=self.sinks)
        else:
            # The driver warns about every session's findings itself (with the rank and loop).
            base = WatchConfig(**{"device": self.device, "out_dir": self.out_dir, "warn": False,
                                  **(defaults or {}), **self.options, "sinks": self.sinks})
        return dataclasses.replace(base, **overrides) if overrides else base

    # ------------------------------------------------------------------ training
    def start(self, total_steps: Any = None, steps_per_epoch: Any = None,
              **defaults: Any) -> MemWatch | None:
        """Start the training session (the given one first; ``defaults``: MemWatch options the
        framework suggests, under the user's); None when it cannot start."""
        mw = self.memwatch
        if mw is not None and mw.running:
            return mw
        try:
            if self.given is not None and not self._given_used:
                mw = self.given
                self._given_used = True
            else:
                if self.log_every_n_steps is not None:
                    defaults.setdefault("log_every_n_steps", self.log_every_n_steps)
                mw = MemWatch.from_config(self.config(defaults))
            mw.start()
        except Exception as e:  # noqa: BLE001 - a broken watcher must not stop training
            log.warning("memwatch: could not start (%s: %s); training continues unwatched",
                        type(e).__name__, e)
            self.memwatch = None
            return None
        self.memwatch = mw
        self.ooms.baseline(mw)
        self.set_total_steps(total_steps, steps_per_epoch)
        if self._pending_state is not None:
            self._restore(self._pending_state)
        return mw

    def set_total_steps(self, total: Any, steps_per_epoch: Any = None) -> None:
        """The run's planned length and its epochs' length, for forecasts and for telling
        accumulation from leaks (each ignored when unknown or set by the user)."""
        mw = self.memwatch
        if mw is None:
            return
        mw.plan_run(_positive_int(total), _positive_int(steps_per_epoch))

    def step(self) -> None:
        mw = self.memwatch
        if mw is not None:
            mw.step()
            if self.told.pending:  # a check ran inside the epoch
                self.told.take()

    def wants_stop(self) -> bool:
        """The watchdog asked this process to stop and the adapter has not stopped yet."""
        mw = self.memwatch
        return bool(self.graceful_stop and mw is not None and mw.should_stop
                    and not self.stopped_by_memwatch)

    def stopping(self, what: str) -> None:
        """The adapter is stopping the run (``what`` it did: "checkpoint saved to ..."); warns
        once with the true reason."""
        if self.stopped_by_memwatch:
            return
        self.stopped_by_memwatch = True
        mw = self.memwatch
        self.stop_reason = (mw.stop_reason if mw is not None else None) or \
            "another rank's memwatch asked the job to stop"
        warnings.warn(f"memwatch: stopping training ({self.stop_reason}); {what}",
                      MemWatchWarning, stacklevel=user_stacklevel())

    # ------------------------------------------------------------------ checks
    def end_epoch(self, stage: str = "train", epoch_end_follows: bool = False) -> list[Finding]:
        """The epoch of ``stage`` ended: its check's findings (logged through the sinks by the
        session), kept and warned about. An evaluation's end is a boundary of training: its
        next check (now, unless the training epoch end ``epoch_end_follows``) reads what the
        evaluation kept."""
        mw = self.memwatch if stage == "train" else self.eval_memwatch.get(stage)
        if mw is not None and mw.running:
            mw.end_epoch()  # never raises (the session disables what fails)
        train = self.memwatch
        if stage != "train" and train is not None and train.running:
            train.boundary(stage, check=not epoch_end_follows)
        return self.told.take()

    @property
    def findings(self) -> list[Finding]:
        """Every finding of every session so far (the latest 1,000)."""
        return self.told.kept

    def eval_start(self, stage: str) -> MemWatch | None:
        """A session of its own for an evaluation loop (kept across its runs)."""
        mw = self.eval_memwatch.get(stage)
        if not self.watch_eval or (mw is not None and mw.running):
            return mw
        try:
            train = self.memwatch
            base = train.config if train is not None else self.config()
            mw = MemWatch.from_config(dataclasses.replace(base.for_evaluation(stage),
                                                          sinks=self.sinks))
            if train is not None and train.running:  # one leak, one verdict: training's
                mw.judge_beside_training()
            mw.start()
        except Exception as e:  # noqa: BLE001
            log.warning("memwatch: could not watch the %s loop (%s: %s)", stage,
                        type(e).__name__, e)
            return None
        self.eval_memwatch[stage] = mw
        return mw

    def current_findings(self) -> list[Finding]:
        """The current verdicts of every session: one finding per belief, its latest state."""
        return current(self.findings)

    def eval_step(self, stage: str) -> None:
        mw = self.eval_memwatch.get(stage)
        if mw is not None:
            mw.step()

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Logger keys reported outside checks, to the framework's loggers."""
        self.sinks.log(metrics, step if step is not None else self._step())

    def _step(self) -> int:
        return self.memwatch.step_count if self.memwatch is not None else 0

    # ------------------------------------------------------------------ failures
    def handle_exception(self, exc: BaseException) -> Path | None:
        """Record a failure: a bundle when configured for its class, from the training session,
        an evaluation session, or a short-lived one when none runs. Never raises."""
        try:
            mw = next((m for m in (self.memwatch, *self.eval_memwatch.values())
                       if m is not None and m.recorder is not None), None)
            temp = None
            if mw is None:
                # Died before training started (or the recorder was off): a short-lived session
                # still writes the bundle with what can be captured now.
                temp = MemWatch.from_config(self.config(signals=False, watchdog=False,
                                                        analyze=False, sinks=None))
                mw = temp.start()
            try:
                path = mw.handle_exception(exc)
            finally:
                if temp is not None:
                    temp.close()
            if path is not None:
                self.bundle_path = Path(path)
                self.sinks.log({f"{PREFIX}/oom": 1.0}, self._step())
                self.sinks.notify("on_failure_bundle", self.bundle_path)
            return path
        except Exception as e:  # noqa: BLE001 - the user's exception must go on unchanged
            log.warning("memwatch: could not record the failure (%s: %s)", type(e).__name__, e)
            return None

    def recovered_oom(self, *, ooms: int | None = None, failed_batch_size: int | None = None,
                      new_batch_size: int | None = None, restart: bool = False,
                      batch_key: str | None = None) -> dict[str, Any]:
        """OOMs the program caught and retried (a batch-size finder): an event, no bundle
        (``recovered_oom="bundle"``: one small bundle for the first of them). One schema for
        every adapter; ``batch_size`` is the failed size when known, else the new one.
        ``ooms=None``: how many the device counted since the previous event (a finder catches
        one per smaller batch it tries), at least one.

        ``restart``: the failed attempt's sessions close and the next attempt starts fresh (its
        samples describe another batch size). Logs ``memwatch/recovered_ooms`` (and the new
        batch size under ``batch_key``)."""
        event = self.ooms.record(self.memwatch, ooms=ooms, failed_batch_size=failed_batch_size,
                                 new_batch_size=new_batch_size)
        if restart:
            self.reset()
        values = {f"{PREFIX}/recovered_ooms": float(self.ooms.count)}
        if batch_key is not None and new_batch_size is not None:
            values[f"{PREFIX}/{batch_key}"] = float(new_batch_size)
        self.log(values)
        return event

    @property
    def recovered_ooms(self) -> list[dict[str, Any]]:
        return self.ooms.events

    @property
    def recovered_oom_count(self) -> int:
        return self.ooms.count

    def has_pending_oom(self) -> bool:
        """An OOM was captured before the unwind and nobody claimed it yet."""
        rec = self.memwatch.recorder if self.memwatch is not None else None
        return rec is not None and rec.has_pending()

    def close(self) -> None:
        """Close every session and the sinks (idempotent, never raises)."""
        for mw in [self.memwatch, *self.eval_memwatch.values()]:
            if mw is not None:
                mw.close()
        self.told.close()  # what the closing checks found; waiting notices said
        self.sinks.close()

    def reset(self) -> None:
        """Forget the sessions (a batch-size finder's retry starts fresh)."""
        self.close()
        self.memwatch = None
        self.eval_memwatch = {}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint: findings, warnings given, the training session's
        :meth:`memwatch.MemWatch.state_dict`, and this process's rank."""
        state: dict[str, Any] = {"version": ADAPTER_STATE_VERSION, "rank": self.rank,
                                 "findings": [], "warned": []}
        try:
            state.update(self.told.state())
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: findings not saved with the checkpoint (%s: %s)",
                        type(e).__name__, e)
        if self.memwatch is not None:
            state["train"] = self.memwatch.state_dict()  # never raises
        return state

    def load_state_dict(self, state: Any) -> None:
        """Continue from :meth:`state_dict` (now, or when training starts). Never raises."""
        restored = read_adapter_state(state)
        if restored is None:
            return
        if restored.rank is not None and int(restored.rank) != self.rank:
            # A checkpoint written by another rank: not this process's memory.
            log.info("memwatch: checkpoint state of rank %s not loaded on rank %d",
                     restored.rank, self.rank)
            return
        self.told.restore(restored.findings, restored.warned)
        if self.memwatch is not None and self.memwatch.running:
            self._restore(restored)
        else:
            self._pending_state = restored

    def _restore(self, restored: RestoredState) -> None:
        self._pending_state = None
        if restored.train is not None and self.memwatch is not None:
            self.memwatch.load_state_dict(restored.train)

    def hook_state_files(self, *registrars: Callable[[Callable[..., None]], Any]) -> list[Any]:
        """Register this driver's state-file writer and reader with a framework that calls hooks
        with the checkpoint folder as their last argument (Accelerate's ``save_state``/
        ``load_state`` pre-hooks); returns the handles."""
        save, load = registrars
        return [save(lambda *a: self.save_state_file(a[-1])),
                load(lambda *a: self.load_state_file(a[-1]))]

    def save_state_file(self, folder: str | os.PathLike[str]) -> None:
        """Write this process's state into a checkpoint folder (atomically). Never raises."""
        try:
            write_state_file(folder, self.rank, self.state_dict())
        except Exception as e:  # noqa: BLE001 - a checkpoint must not fail because of memwatch
            log.warning("memwatch: could not save its state with the checkpoint (%s: %s)",
                        type(e).__name__, e)

    def load_state_file(self, folder: str | os.PathLike[str]) -> None:
        """Read this process's state from a checkpoint folder, if it has one. Never raises."""
        try:
            state = read_state_file(folder, self.rank)
            if state is None:
                log.info("memwatch: %s has no memwatch state; the analysis starts fresh",
                         folder)
                return
            self.load_state_dict(state)
        except Exception as e:  # noqa: BLE001 - a bad state must not stop the resumed run
            log.warning("memwatch: could not read its state from the checkpoint (%s: %s); the "
                        "analysis starts fresh", type(e).__name__, e)


def _positive_int(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if 0 < f < 1e15 else None
